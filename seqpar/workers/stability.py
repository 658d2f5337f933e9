"""How sure a trial's step time is: the median's 95% confidence interval, the host's noise while the
timed loop ran, and the rule that marks a trial *unstable* (with its reason). Every number here is
computed once, on the driver, from what the ranks sent (`workers.metrics.TrialMetrics`); the
runner logs them (the reason as the tag `seqpar.unstable`) and hands them to the report.

- Interval: a seeded percentile bootstrap of the median over the timed iterations
  (`scipy.stats.bootstrap`), so the same samples always give the same interval. Percentile, not BCa:
  BCa is undefined for the tiny, tied samples a quick trial has. With n samples no interval of a
  median is finer than the order statistics: under 6 iterations the bootstrap interval is about the
  sample range and covers less than 95% (3 iterations: [min, max] covers 75%); `step_ms_samples`
  says n.
- Noise (see `workers.measure.noise`): the CPU time other processes took on each host (its busy
  time less the trial's own ranks' CPU time), a hypervisor's steal, the 1-minute load average, ranks
  per core and how long the ranks waited for a CPU.
- Unstable when the interval's half-width exceeds 10% of the median (pyperf's `check` warns when
  the standard deviation exceeds 10% of the mean), or other processes used more than 10% of a host's
  CPU time, or steal exceeded 5%. (Measured here, quickstart on 2 cores: with others at 0-8% the
  trials ran 1.1-1.4x faster than with others at 18-25%, whose intervals were still narrow; a
  wide-interval rule alone misses a host that is steadily busy.) Ranks that outnumber cores are
  the trial's own, repeatable contention: recorded (`noise_ranks_per_core`) and flagged
  oversubscribed by the table, not unstable. Ranks that ran different attention kernels (one node
  without flash-attn) measured different things: unstable, with the kernels by rank. The load
  average lags (a 1-minute mean that still holds the previous trial's ranks) and counts what waits
  on I/O: shown, not ruled.
- Two trials differ measurably when their intervals do not overlap: asv's check when samples are
  too few for its Mann-Whitney test, pessimistic (overlapping intervals may still differ, hence
  "no measurable difference", not "equal"). The ratio's interval [lo_a / hi_b, hi_a / lo_b] holds 1
  exactly when they overlap.
"""

from __future__ import annotations

import statistics
import warnings
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

CONFIDENCE = 0.95
RESAMPLES = 2000
SEED = 0
MAX_HALF_WIDTH = 0.10   # of the median
MAX_OTHERS_CPU = 0.10   # of a host's CPU time over the loop, taken by processes not of the trial
MAX_STEAL = 0.05        # of a host's CPU time, given by the hypervisor to other machines
NO_DIFFERENCE = "no measurable difference"


def median_ci(samples: Sequence[float], confidence: float = CONFIDENCE, seed: int = SEED,
              resamples: int = RESAMPLES) -> tuple[float, float]:
    """The median's confidence interval by a seeded percentile bootstrap; one sample (or all
    equal) is its own interval."""
    if len(samples) < 2 or min(samples) == max(samples):
        return float(samples[0]), float(samples[0])
    import numpy as np
    from scipy import stats

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy's "degenerate data" warning for tiny samples
        res = stats.bootstrap((np.asarray(samples, dtype=float),), np.median,
                              confidence_level=confidence, n_resamples=resamples,
                              method="percentile", rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def host_noise(samples: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The ranks' noise samples (one per rank, `NoiseMeter.sample`) as metrics: the worst host's
    `noise_others_cpu_frac`, `noise_steal_frac`, `noise_load_1m`, `noise_ranks_per_core`, the
    worst rank's `noise_run_delay_frac`, and on a CPU the ranks' mean speed probe
    (`noise_probe_ms`, `measure.probe`). Readings a host lacks are left out."""
    by_host: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for s in samples:
        if s:
            by_host[str(s.get("host", "?"))].append(s)
    out: dict[str, float] = {}

    def worst(key: str, value: float) -> None:
        out[key] = max(out.get(key, value), value)

    for ranks in by_host.values():
        wall = max(s["wall_s"] for s in ranks)
        worst("noise_load_1m", max(max(s["load_1m_before"], s["load_1m_after"]) for s in ranks))
        worst("noise_ranks_per_core", len(ranks) / max(1, min(s["cores"] for s in ranks)))
        stat = [s for s in ranks if "host_busy_s" in s]
        if stat and wall > 0:
            capacity = wall * max(s["host_cores"] for s in stat)
            others = max(s["host_busy_s"] for s in stat) - sum(s["cpu_s"] for s in ranks)
            worst("noise_others_cpu_frac", min(1.0, max(0.0, others) / capacity))
            worst("noise_steal_frac", max(s["host_steal_s"] for s in stat) / capacity)
        for s in ranks:
            if "run_delay_s" in s and s["wall_s"] > 0:
                worst("noise_run_delay_frac", s["run_delay_s"] / s["wall_s"])
    probes = [s["probe_s"] for s in samples if s and "probe_s" in s]
    if probes:  # the host's speed over the trial (`measure.probe`): the ranks' mean
        out["noise_probe_ms"] = 1e3 * statistics.fmean(probes)
    return out


def step_stats(steps: Sequence[float]) -> dict[str, float]:
    """`step_ms` (the median), its interval `step_ms_ci_low` / `step_ms_ci_high`, and n."""
    lo, hi = median_ci(steps)
    return {"step_ms": statistics.median(steps), "step_ms_ci_low": lo, "step_ms_ci_high": hi,
            "step_ms_samples": float(len(steps))}


def half_width(metrics: Mapping[str, float]) -> float | None:
    """The interval's half-width as a fraction of the median; None without an interval."""
    try:
        return (metrics["step_ms_ci_high"] - metrics["step_ms_ci_low"]) / 2 / metrics["step_ms"]
    except (KeyError, ZeroDivisionError):
        return None


def mixed_kernels(kernels: Sequence[str]) -> str | None:
    """'rank 0-1: flash-attn 2.7.4, rank 2-3: torch-efficient' when the ranks ran different
    kernels (consecutive ranks of one kernel as a range); None when they agree."""
    if len(set(kernels)) < 2:
        return None
    runs: list[list[Any]] = []  # [first rank, last rank, kernel]
    for rank, name in enumerate(kernels):
        if runs and runs[-1][2] == name:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank, name])
    return ", ".join(f"rank {a}{f'-{b}' if b > a else ''}: {name}" for a, b, name in runs)


def unstable_reason(metrics: Mapping[str, float], kernels: Sequence[str] = ()) -> str | None:
    """Why a trial's step time cannot be trusted (see the module docstring), or None. Each reason
    is a short head, then its detail in parentheses (`short_reason` keeps the heads); reasons are
    joined by '; ', which no detail contains. `kernels`: the attention kernel of each rank."""
    reasons = []
    mixed = mixed_kernels(kernels)
    if mixed is not None:
        reasons.append(f"mixed kernels ({mixed})")
    width = half_width(metrics)
    if width is not None and width > MAX_HALF_WIDTH:
        reasons.append(f"interval ±{width:.0%} (of the median, > {MAX_HALF_WIDTH:.0%}, "
                       f"{metrics.get('step_ms_samples', 0):.0f} iterations)")
    others = metrics.get("noise_others_cpu_frac")
    if others is not None and others > MAX_OTHERS_CPU:
        reasons.append(f"host busy {others:.0%} (other processes' share of the host's CPU time "
                       f"over the timed loop, > {MAX_OTHERS_CPU:.0%}, "
                       f"load {metrics.get('noise_load_1m', 0):.1f})")
    steal = metrics.get("noise_steal_frac")
    if steal is not None and steal > MAX_STEAL:
        reasons.append(f"steal {steal:.0%} (CPU time the hypervisor gave other machines, "
                       f"> {MAX_STEAL:.0%})")
    return "; ".join(reasons) or None


def short_reason(reason: str) -> str:
    """A reason's heads only: 'interval ±43%; host busy 98%'."""
    return "; ".join(part.split(" (")[0] for part in reason.split("; ") if part)


def ratio(a: Mapping[str, float], b: Mapping[str, float]) -> tuple[float, float, float] | None:
    """Step time of `a` over `b` with the interval [lo_a / hi_b, hi_a / lo_b]; None without both
    intervals."""
    keys = ("step_ms", "step_ms_ci_low", "step_ms_ci_high")
    if not all(k in a for k in keys) or not all(k in b for k in keys) or b["step_ms_ci_low"] <= 0:
        return None
    return (a["step_ms"] / b["step_ms"], a["step_ms_ci_low"] / b["step_ms_ci_high"],
            a["step_ms_ci_high"] / b["step_ms_ci_low"])


def verdict(lo: float, hi: float) -> str:
    """What a step-time ratio's interval says: faster, slower, or no measurable difference."""
    if lo > 1.0:
        return f"slower: {lo:.3g}-{hi:.3g}x the time"
    if hi < 1.0:
        return f"faster: {1 / hi:.3g}-{1 / lo:.3g}x the speed"
    return NO_DIFFERENCE
