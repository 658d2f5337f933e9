"""Which plots a set of runs gets, and the speed-up arithmetic behind the scaling plot."""

from __future__ import annotations

from seqpar.platform.tracking import RunRecord
from seqpar.sweeps.report import figures, scaling_series


def run(algorithm: str, world: int, seq_len: int, tps: float) -> RunRecord:
    return RunRecord("id", f"{algorithm}-{world}-{seq_len}", "FINISHED", 0,
                     params={"plan.algorithm": algorithm, "plan.world": str(world),
                             "workload.seq_len": str(seq_len), "model.kv_heads": "8"},
                     metrics={"tokens_per_s": tps, "peak_mem_bytes": 1.0, "bytes_total": 2.0,
                              "bytes_intra": 2.0, "bytes_inter": 0.0})


def test_strong_scaling_is_against_one_rank_at_the_same_length():
    runs = [run("local", 1, 4096, 100.0), run("ring", 2, 4096, 180.0), run("ring", 4, 4096, 300.0)]
    assert scaling_series(runs) == {"ring N=4096": [(2, 1.8), (4, 3.0)]}


def test_weak_scaling_is_against_one_rank_at_the_per_rank_length():
    runs = [run("local", 1, 1024, 100.0), run("ring", 1, 1024, 90.0), run("ring", 2, 2048, 150.0),
            run("ring", 4, 4096, 250.0)]
    series = scaling_series(runs)
    assert "ring N=1024" not in series  # one world size is not a series
    assert series["ring N/P=1024"] == [(1, 0.9), (2, 1.5), (4, 2.5)]


def test_one_world_per_configuration_draws_no_scaling_plot():
    runs = [run("local", 1, 2048, 100.0), run("ring", 4, 2048, 150.0), run("local", 1, 4096, 50.0),
            run("ring", 4, 4096, 90.0)]
    assert set(figures(runs)) == {"throughput_vs_seq_len", "memory_vs_seq_len", "bytes_by_link"}
