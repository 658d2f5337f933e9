"""TrialMetrics on hand-made rank measurements: the aggregation rules, computed once."""

from __future__ import annotations

import json

import pytest

from seqpar.case import Case, Trial
from seqpar.workers.measure import RankMeasurement
from seqpar.workers.metrics import TrialMetrics
from seqpar.workers.result import TrialResult


def rank(r: int, steps: list[float], flops: float, entries: list[tuple[str, str, int]]):
    ledger = {"entries": [{"op": "p2p", "group": "sp", "link": link, "phase": phase,
                           "bytes_sent": n, "calls": 1} for phase, link, n in entries],
              "flops": {"forward": flops, "backward": 0.0}}
    return RankMeasurement(r, steps, [s / 2 for s in steps], [s / 2 for s in steps],
                           {"forward": flops, "backward": 0.0}, ledger,
                           {"forward": sum(n for _, _, n in entries), "backward": 0},
                           1000 * (r + 1), "rss-hwm-delta")


def test_step_time_is_the_median_over_iterations_of_the_slowest_rank():
    case = Case("ring", world=2, batch=2, seq_len=48, iters=3)
    ranks = [rank(0, [10.0, 30.0, 12.0], 3e9, [("forward", "intra", 100)]),
             rank(1, [20.0, 11.0, 40.0], 1e9, [("forward", "inter", 300)])]
    result = TrialResult(Trial(case, "g"), "FAILED", None, [], [0, 1], 1.0, 2.0, "cpu")
    result.finish(ranks)
    m = result.metrics
    assert result.ok and m is result.metrics  # computed once, kept
    assert m["step_ms"] == 30.0  # per-step maxima 20, 30, 40
    assert m["tokens_per_s"] == pytest.approx(96 / 0.030)
    assert m["tokens_per_s_per_rank"] == pytest.approx(96 / 0.030 / 2)
    assert m["attn_tflops"] == pytest.approx(4e9 / 0.030 / 1e12)
    assert m["load_imbalance"] == pytest.approx(1.5)
    assert m["peak_mem_bytes"] == 2000
    assert (m["bytes_intra"], m["bytes_inter"], m["bytes_total"]) == (100, 300, 400)
    assert m["bytes_forward_p2p_inter"] == 300 and m["bytes_forward_p2p_intra"] == 100
    assert "mfu" not in m  # no known peak for a CPU
    assert m["bytes_analytic_per_rank"] > 0 and m.series["iter_step_ms"] == (20.0, 30.0, 40.0)
    assert (m["setup_s"], m["run_s"]) == (1.0, 2.0)
    json.dumps(result.to_dict(), allow_nan=False)


def test_failed_trial_has_no_metrics():
    result = TrialResult(Trial(Case("ring", world=2), "g"), "FAILED", "timeout", [], [], 0.0, 0.0,
                         "cpu")
    assert dict(result.metrics) == {} and result.metrics.unstable is None
    assert len(TrialMetrics.of(result.trial, [])) == 0
