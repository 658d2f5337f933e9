"""The comparison table `seqpar compare` prints and the sweep's parent run stores: one row per trial,
the best by the metric highlighted, the median step time with its 95% interval, the speed-up over
`local` at the same shape, oversubscribed CPU runs (more ranks than cores) and unstable trials (a
wide interval or a busy host, with the reason) flagged."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from seqpar.errors import ConfigError
from seqpar.experiments.registry import higher_is_better
from seqpar.platform.tracking import Tracker
from seqpar.sweeps.report.view import Trial, trials
from seqpar.workers.stability import short_reason

# metrics the table always shows; any other ranking metric gets a column of its own
SHOWN = ("step_ms", "tokens_per_s", "peak_mem_bytes", "bytes_total", "load_imbalance", "bytes_inter")


@dataclass
class Comparison:
    title: str
    columns: list[str]
    rows: list[list[Any]]
    best: int | None
    metric: str


def sort_key(t: Trial) -> tuple:
    return (t.seq_len, t.kv_heads or 0, t.world,
            t.config, t.layout or "", -(t.window or 1 << 62), t.dtype or "")


def select(tracker: Tracker, study: str | None, sweep: str | None) -> tuple[str, list[Trial]]:
    if sweep is not None:
        record = tracker.sweep(sweep)
        return f"sweep {record.name} ({sweep})", trials(tracker.trials(sweep))
    if study is not None:
        return f"study {study}", trials(tracker.study_trials(study))
    latest = tracker.latest_sweep()
    if latest is None:
        raise ConfigError("tracking-uri", tracker.uri, "holds no sweep yet; run `seqpar sweep` first")
    return f"sweep {latest.name} ({latest.run_id})", trials(tracker.trials(latest.run_id))


def _headline(tracker: Tracker, sweep: str | None, runs: list[Trial]) -> str | None:
    """The metric the sweep (or, for the latest sweep, its trials) was tagged to rank by."""
    if sweep is not None:
        return tracker.sweep(sweep).tags.get("seqpar.headline")
    return runs[0].headline if runs else None


def comparison(tracker: Tracker, study: str | None = None, sweep: str | None = None,
               metric: str | None = None) -> Comparison:
    title, runs = select(tracker, study, sweep)
    if metric is None and (sweep is not None or study is None):
        metric = _headline(tracker, sweep, runs)
    return table(title, runs, metric or "tokens_per_s")


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


UNSTABLE_NOTE = ("unstable = a 95% interval wider than ±10% of the median, or a host busy with "
                 "other processes (their share of its CPU): measure again (`seqpar sweep FILE "
                 "--rerun-unstable N`, more workload.iters, a quieter host)")


def interval(t: Trial) -> str:
    """The step time's 95% interval as '11.9-12.8' (whole ms from 1000 up); '-' when not logged."""
    ci = t.interval
    if ci is None:
        return "-"
    return "-".join(f"{v:.1f}" if v < 1000 else f"{v:.0f}" for v in ci)


def status(t: Trial) -> str:
    """FINISHED, or the failure with its cause."""
    return t.status if t.finished else f"{t.status}: {t.cause[:80]}"


def _same_shape(t: Trial) -> tuple:
    """Trials at the same (N, H, Hkv, mask, dtype): `local` among them is the speed-up baseline."""
    return (t.seq_len, t.heads, t.kv_heads, t.mask, t.dtype)


def table(title: str, runs: list[Trial], metric: str) -> Comparison:
    """The rows for these trials, ranked by `metric` in its direction."""
    logged = {k for t in runs for k in t.metrics}
    if logged and metric not in logged:
        raise ConfigError("metric", metric, f"is not logged here; one of {', '.join(sorted(logged))}")
    runs = sorted(runs, key=sort_key)
    local = {_same_shape(t): t.metrics.get("tokens_per_s") for t in runs
             if t.algorithm == "local" and t.finished}
    columns = ["algorithm", "P", "nodes", "layout", "N", "H/Hkv", "step ms", "95% CI", "tokens/s",
               "x local", "peak MiB", "MB sent", "imbalance", "status"]
    masks = len({t.mask for t in runs}) > 1 or any(t.mask not in ("causal", "full") for t in runs)
    if masks:
        columns.insert(columns.index("H/Hkv") + 1, "mask")
    dtypes = len({t.dtype for t in runs}) > 1
    if dtypes:
        columns.insert(columns.index("H/Hkv") + 1, "dtype")
    inter = any(t.metrics.get("bytes_inter", 0) > 0 for t in runs)  # the plan spans nodes
    if inter:
        columns.insert(columns.index("MB sent") + 1, "MB inter")
    extra = metric not in SHOWN
    if extra:
        columns.insert(-1, metric)
    shaky = any(t.unstable for t in runs)
    if shaky:
        columns.insert(-1, "unstable")
    over = any(t.oversubscribed for t in runs)
    if over:
        columns.insert(columns.index("P") + 1, "cores")
    rows, scores = [], []
    for t in runs:
        m = t.metrics
        base = local.get(_same_shape(t))
        row = [t.config, str(t.world)]
        if over:
            row.append(f"{t.cores} OVERSUBSCRIBED" if t.oversubscribed else str(t.cores or "-"))
        row += [t.nodes, t.layout, str(t.seq_len), f"{t.heads}/{t.kv_heads}",
                *([t.dtype] if dtypes else []),
                *([t.mask] if masks else []),
                _fmt(m.get("step_ms"), ".1f"), interval(t), _fmt(m.get("tokens_per_s"), ",.0f"),
                _fmt(m["tokens_per_s"] / base if base and "tokens_per_s" in m else None, ".2f"),
                _fmt(m["peak_mem_bytes"] / 2**20 if "peak_mem_bytes" in m else None, ".1f"),
                _fmt(m["bytes_total"] / 1e6 if "bytes_total" in m else None, ".2f")]
        if inter:
            row.append(_fmt(m["bytes_inter"] / 1e6 if "bytes_inter" in m else None, ".2f"))
        row.append(_fmt(m.get("load_imbalance"), ".2f"))
        if extra:
            row.append(_fmt(m.get(metric), ".4g"))
        if shaky:
            row.append(short_reason(t.unstable) if t.unstable else "")
        row.append(status(t))
        rows.append(row)
        scores.append(m.get(metric) if t.finished else None)
    valid = [(s, i) for i, s in enumerate(scores) if s is not None]
    best = None
    if valid:
        best = (max(valid) if higher_is_better(metric) else min(valid))[1]
    direction = "higher" if higher_is_better(metric) else "lower"
    note = "; OVERSUBSCRIBED = more ranks than cores: times measure contention" if over else ""
    if shaky:
        note += f"; {UNSTABLE_NOTE}"
    return Comparison(f"{title}: best by {metric} ({direction} is better){note}", columns, rows,
                      best, metric)
