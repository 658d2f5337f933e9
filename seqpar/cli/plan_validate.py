"""`seqpar plan --validate SWEEP`: predicted vs measured for a finished sweep's trials."""

from __future__ import annotations

import json
from typing import Any

from seqpar.cli import options
from seqpar.cli.display import console, display_table
from seqpar.experiments.spec import specs_of
from seqpar.planner import plan as perf_plan


def _memory_cell(pair: tuple[float, float] | None) -> str:
    if pair is None:
        return ""
    predicted, measured = pair
    error = f" ({100 * (predicted - measured) / measured:+.0f}%)" if measured else ""
    return f"{predicted / 1e6:.2f}/{measured / 1e6:.2f}{error}"


def _imbalance_cell(pair: tuple[float, float] | None) -> str:
    if pair is None:
        return ""
    return f"{pair[0]:.3f}/{pair[1]:.3f}"


def validate(sweep_id: str, cluster: Any, as_json: bool) -> None:
    """Predicted vs measured for every trial of a finished sweep (and, for trials of lengths, the
    predicted imbalance beside the measured load_imbalance)."""

    tracker = _reader(sweep_id)
    checks = perf_plan.validate(specs_of((t.params, t.metrics) for t in tracker.trials(sweep_id)),
                                cluster)
    s = perf_plan.summary(checks)
    memory = [k for k in ("state_bytes", "activation_bytes") if any(k in c.memory for c in checks)]
    paired = any(c.imbalance is not None for c in checks)
    rows = [[c.label, f"{c.measured_ms:.2f}", f"{c.predicted_ms:.2f}", f"{100 * c.error:+.1f}%",
             *(_memory_cell(c.memory.get(k)) for k in memory),
             *([_imbalance_cell(c.imbalance)] if paired else [])]
            for c in sorted(checks, key=lambda c: c.measured_ms)]
    if as_json:
        print(json.dumps({"cluster": cluster.name, "summary": s, "trials": [
            {"label": c.label, "measured_ms": c.measured_ms, "predicted_ms": c.predicted_ms,
             "others_cpu_frac": c.others, "host_speed": c.speed, "probe_ms": c.probe_ms,
             **{k: {"predicted": v[0], "measured": v[1]} for k, v in c.memory.items()},
             **({"imbalance": {"predicted": c.imbalance[0], "measured": c.imbalance[1]}}
                if c.imbalance is not None else {})}
            for c in checks]}, indent=1))
        return
    display_table(f"sweep {sweep_id} on {cluster.name}: predicted vs measured step",
                  ["trial", "measured ms", "predicted ms", "error",
                   *(f"{k.split('_')[0]}s MB pred/meas" for k in memory),
                   *(["imbalance pred/meas"] if paired else [])], rows)
    if s["trials"]:
        console.print(f"median |error| {100 * s['median_abs_error']:.1f}% over {s['trials']} trials")
        busy = [c.others for c in checks]
        if max(busy) > 0.1:  # a host others shared (`noise_others_cpu_frac`, docs/results.md)
            console.print(f"other processes took {100 * min(busy):.0f}-{100 * max(busy):.0f}% of the "
                          f"host over the timed loops: each prediction over (1 - that share), the "
                          f"ranks' fair share, is off by {100 * s['median_abs_error_host_share']:.1f}%"
                          " (median)")
        probes = [c.probe_ms for c in checks if c.probe_ms]
        if probes:  # a CPU host (`noise_probe_ms`): how much of the error its speed accounts for
            speeds = [c.speed for c in checks if c.speed != 1.0]
            against = (f" ({min(speeds):.2f}-{max(speeds):.2f}x the calibration's "
                       f"{cluster.probe_ms:.2f}; ranks side by side slow it too)" if speeds else "")
            console.print(f"the host's speed probe read {min(probes):.2f}-{max(probes):.2f} ms over "
                          f"the trials{against}; the median trial is exact where it reads "
                          f"{s['probe_at_zero_error_ms']:.2f} ms (a step as slow as the probe)")
        if "imbalance_median_abs_error" in s:
            console.print(f"imbalance (max / mean attention FLOPs over ranks) against the measured "
                          f"load_imbalance: median |error| "
                          f"{100 * s['imbalance_median_abs_error']:.1f}%")
        for group, regret in s["regret"].items():
            console.print(f"  {group}: predicted best {s['predicted_best'][group]} is "
                          f"{100 * regret:.1f}% off the measured best")


def _reader(sweep_id: str) -> Any:
    """The tracker holding `sweep_id`, or one line (exit 2) when it cannot: a store that does not
    exist is not created (nor its lock, `options.tracker(existing=True)`), an id it does not hold
    is refused."""
    tracker = options.tracker(existing=True)
    tracker.sweep(sweep_id, field="validate")
    return tracker
