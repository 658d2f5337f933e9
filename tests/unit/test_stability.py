"""The statistics of a trial's step time: the seeded bootstrap interval, the host's noise, the
unstable rule and the ratio of two trials (workers.stability, workers.measure.noise)."""

from __future__ import annotations

import dataclasses
import io
import os
import random
import statistics
import time

import pytest

from seqpar.case import Case, Trial
from seqpar.workers import stability
from seqpar.workers.measure import RankMeasurement
from seqpar.workers.measure.noise import NoiseMeter
from seqpar.workers.metrics import TrialMetrics


def draw(seed: int, n: int, median: float, spread: float) -> list[float]:
    rng = random.Random(seed)
    return [median * (1 + rng.uniform(-spread, spread)) for _ in range(n)]


def test_interval_is_a_seeded_bootstrap_that_brackets_the_median(seed):
    samples = draw(seed, 40, 100.0, 0.3)
    lo, hi = stability.median_ci(samples)
    assert (lo, hi) == stability.median_ci(list(samples))  # deterministic: same samples, same CI
    assert lo <= statistics.median(samples) <= hi
    assert min(samples) < lo < hi < max(samples)  # 40 samples pin the median well inside the range
    wider = stability.median_ci(samples, confidence=0.99)
    assert wider[0] <= lo and wider[1] >= hi
    # another seed resamples differently, yet lands near (percentiles of discrete medians)
    assert stability.median_ci(samples, seed=seed + 1) == pytest.approx((lo, hi), rel=0.05)


def test_interval_of_known_samples_is_the_percentiles_of_resampled_medians():
    """Three iterations: a resampled median is the smallest value with probability 7/27, the
    largest likewise, so the 95% interval is the sample range (it covers only 75%)."""
    assert stability.median_ci([12.0, 10.0, 11.0]) == (10.0, 12.0)
    assert stability.median_ci([5.0]) == (5.0, 5.0)
    assert stability.median_ci([7.0, 7.0, 7.0, 7.0]) == (7.0, 7.0)


def test_interval_narrows_with_more_iterations(seed):
    """400 iterations' interval is under half of 8 iterations' (the median width of five draws
    of 8: one draw of 8 bunched by chance failed it in 5 of 300 seeds, five in none)."""
    widths = [b - a for a, b in (stability.median_ci(draw(seed + 7919 * k, 8, 50.0, 0.2))
                                 for k in range(5))]
    c, d = stability.median_ci(draw(seed, 400, 50.0, 0.2))
    assert d - c < statistics.median(widths) / 2


def quiet_host(rank: int, wall: float = 1.0, cpu: float = 0.9, others: float = 0.0,
               host: str = "h", steal: float = 0.0) -> dict:
    return {"wall_s": wall, "cpu_s": cpu, "cores": 4, "load_1m_before": 1.0,
            "load_1m_after": 1.2, "host": host, "run_delay_s": 0.05, "host_cores": 4,
            "host_busy_s": 2 * cpu + others, "host_steal_s": steal}  # two ranks per host


def test_host_noise_subtracts_the_trials_own_ranks_from_the_hosts_busy_time():
    quiet = stability.host_noise([quiet_host(0), quiet_host(1)])
    assert quiet["noise_others_cpu_frac"] == pytest.approx(0.0)
    assert quiet["noise_ranks_per_core"] == pytest.approx(0.5)
    assert quiet["noise_load_1m"] == pytest.approx(1.2)
    assert quiet["noise_run_delay_frac"] == pytest.approx(0.05)
    busy = stability.host_noise([quiet_host(0), quiet_host(1), quiet_host(2, others=2.0, host="g"),
                                 quiet_host(3, others=2.0, host="g")])
    assert busy["noise_others_cpu_frac"] == pytest.approx(2.0 / 4)  # the worse host: 2 of 4 CPU-s
    assert stability.host_noise([{}, {}]) == {}


def metrics(samples: list[float], noise: list[dict]) -> dict[str, float]:
    return {**stability.step_stats(samples), **stability.host_noise(noise)}


def test_wide_or_busy_trials_are_unstable_and_a_tight_quiet_one_is_not(seed):
    quiet = [quiet_host(0), quiet_host(1)]
    tight = draw(seed, 30, 20.0, 0.02)
    assert stability.unstable_reason(metrics(tight, quiet)) is None
    wide = draw(seed, 5, 20.0, 0.6)
    reason = stability.unstable_reason(metrics(wide, quiet))
    assert reason is not None and reason.startswith("interval ±") and "5 iterations" in reason
    busy = [quiet_host(0, others=2.0), quiet_host(1, others=2.0)]
    reason = stability.unstable_reason(metrics(tight, busy))
    assert reason is not None and reason.startswith("host busy 50% (")
    both = stability.unstable_reason(metrics(wide, busy)) or ""
    width = stability.half_width(metrics(wide, busy))
    assert stability.short_reason(both) == f"interval ±{width:.0%}; host busy 50%"
    stolen = [quiet_host(0, steal=0.4), quiet_host(1, steal=0.4)]
    assert "steal 10%" in (stability.unstable_reason(metrics(tight, stolen)) or "")


def test_ratio_interval_holds_one_exactly_when_the_intervals_overlap(seed):
    rng = random.Random(seed)
    for _ in range(200):
        a_lo, b_lo = rng.uniform(1, 10), rng.uniform(1, 10)
        a = {"step_ms": a_lo * 1.05, "step_ms_ci_low": a_lo, "step_ms_ci_high": a_lo * 1.1}
        b = {"step_ms": b_lo * 1.05, "step_ms_ci_low": b_lo, "step_ms_ci_high": b_lo * 1.1}
        r, lo, hi = stability.ratio(a, b)
        overlap = a_lo <= b_lo * 1.1 and b_lo <= a_lo * 1.1
        assert lo <= r <= hi
        assert (stability.verdict(lo, hi) == stability.NO_DIFFERENCE) == overlap
    assert stability.verdict(0.5, 0.8).startswith("faster")
    assert stability.verdict(1.2, 1.4).startswith("slower")
    assert stability.ratio({"step_ms": 1.0}, {"step_ms": 1.0}) is None


def test_trial_result_reports_its_interval_noise_and_reason(seed):
    steps = draw(seed, 6, 30.0, 0.5)
    ranks = [RankMeasurement(r, steps, [s / 2 for s in steps], [s / 2 for s in steps],
                             {"forward": 1.0}, {"entries": [], "flops": {}}, {"forward": 0},
                             1000, "rss-hwm-delta", noise=quiet_host(r, others=3.0))
             for r in range(2)]
    m = TrialMetrics.of(Trial(Case("ring", world=2, iters=6), "g"), ranks)
    assert m["step_ms_ci_low"] <= m["step_ms"] <= m["step_ms_ci_high"]
    assert m["step_ms_samples"] == 6 and m["noise_others_cpu_frac"] == pytest.approx(0.75)
    assert "host busy" in (m.unstable or "")


def test_a_trial_whose_ranks_ran_different_kernels_is_unstable_with_them(seed):
    steps = draw(seed, 6, 30.0, 0.001)  # a tight interval, a quiet host: only the kernels differ
    names = ["flash-attn 2.7.4", "flash-attn 2.7.4", "torch-efficient", "torch-efficient"]
    ranks = [RankMeasurement(r, steps, [s / 2 for s in steps], [s / 2 for s in steps],
                             {"forward": 1.0}, {"entries": [], "flops": {}}, {"forward": 0},
                             1000, "cuda-allocator-peak", noise=quiet_host(r), kernel=names[r],
                             gemm_dtype="bfloat16")
             for r in range(4)]
    mixed = TrialMetrics.of(Trial(Case("ring", world=4, iters=6), "g"), ranks)
    assert mixed.unstable == ("mixed kernels (rank 0-1: flash-attn 2.7.4, rank 2-3: "
                              "torch-efficient)")
    assert stability.short_reason(mixed.unstable) == "mixed kernels"
    assert mixed.kernel == "mixed: flash-attn 2.7.4, torch-efficient"
    assert mixed.gemm_dtype == "bfloat16"
    same = [dataclasses.replace(m, kernel=names[0]) for m in ranks]
    agreed = TrialMetrics.of(Trial(Case("ring", world=4, iters=6), "g"), same)
    assert agreed.unstable is None and agreed.kernel == "flash-attn 2.7.4"


def test_noise_meter_sees_this_process_and_the_host():
    with NoiseMeter() as noise:
        end = time.perf_counter() + 0.3
        while time.perf_counter() < end:
            pass
    s = noise.sample
    assert s["wall_s"] >= 0.3 and 0 <= s["cpu_s"] <= s["wall_s"] + 0.05
    assert s["cores"] == len(os.sched_getaffinity(0))
    assert s["host_cores"] == os.cpu_count() and s["host_busy_s"] >= 0 and s["host_steal_s"] >= 0
    assert s["run_delay_s"] >= 0 and s["load_1m_before"] >= 0
    # the spinning process itself is busy time of the host, so the host was busy at least that long
    assert s["host_busy_s"] >= s["cpu_s"] - 0.05


def test_progress_line_counts_the_unstable_trials():
    from rich.console import Console

    from seqpar.sweeps.progress import SweepProgress

    live = SweepProgress(Console(file=io.StringIO()), [None, None, None], "g",
                         enabled=False)
    live.end_trial(1.0, unstable=True)
    live.end_trial(1.0)
    assert live.bar.tasks[0].fields["left"] == "trials 2/3, 1 unstable"
