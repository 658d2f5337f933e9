"""Which plots a set of runs gets, and the speed-up arithmetic behind the scaling plot."""

from __future__ import annotations

import os

import pytest

from seqpar.platform.tracking import RunRecord
from seqpar.sweeps.report import TrialView
from seqpar.sweeps.report.plots import figures as figures_of
from seqpar.sweeps.report.plots import scaling_series as scaling_of


def figures(runs: list[RunRecord]) -> dict:
    return figures_of([TrialView.of(r) for r in runs])


def scaling_series(runs: list[RunRecord]) -> dict:
    return scaling_of([TrialView.of(r) for r in runs])


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


# ------------------------------------------------------------------ the style every plot shares
def test_sequence_lengths_read_as_2k_128k_1m():
    from seqpar.sweeps.style import tokens

    assert [tokens(n) for n in (512, 2048, 4096, 131072, 2**20, 1536)] == \
        ["512", "2K", "4K", "128K", "1M", "1.5K"]


def test_an_algorithm_has_one_colour_everywhere():
    import subprocess
    import sys

    from seqpar.sweeps.style import ALGORITHM_COLOURS, colour

    known = [colour(name) for name in ALGORITHM_COLOURS]
    assert len(set(known)) == len(known)  # no two algorithms share a colour
    # an unknown name gets one colour in every process (not Python's per-process string hash)
    names = ["some_new_algo", "ring2", "flash_ring", "x"]
    script = f"from seqpar.sweeps.style import colour; print([colour(n) for n in {names!r}])"
    runs = {subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout
            for seed in ("1", "2")}
    assert runs == {f"{[colour(n) for n in names]}\n"}
    assert len({colour(n) for n in names}) > 1 and not {colour(n) for n in names} & set(known)


def tagged(r: RunRecord, cores: int, world: int | None = None) -> RunRecord:
    r.tags.update({"seqpar.cpu_count": str(cores), "seqpar.device": "cpu",
                   "seqpar.topology": "virtual"})
    if world is not None:
        r.params["plan.world"] = str(world)
    return r


def test_more_ranks_than_cores_is_oversubscribed():
    def oversubscribed(r: RunRecord) -> bool:
        return TrialView.of(r).oversubscribed

    assert oversubscribed(tagged(run("ring", 4, 4096, 1.0), cores=2))
    assert not oversubscribed(tagged(run("ring", 2, 4096, 1.0), cores=2))
    assert not oversubscribed(run("ring", 4, 4096, 1.0))  # cores unknown: no claim
    gpu = tagged(run("ring", 4, 4096, 1.0), cores=2)
    gpu.tags["seqpar.device"] = "cuda"
    assert not oversubscribed(gpu)


def test_scaling_plot_has_integer_world_ticks_the_ideal_line_bands_and_marks():
    runs = [tagged(run("local", 1, 4096, 100.0), 2), tagged(run("ring", 2, 4096, 180.0), 2),
            tagged(run("ring", 4, 4096, 300.0), 2)]
    for r in runs:
        r.metrics.update({"step_ms": 10.0, "step_ms_p10": 9.0, "step_ms_p90": 12.0})
    fig = figures(runs)["scaling_vs_world"]
    speedup, efficiency = fig.axes[:2]
    assert [t.get_text() for t in speedup.get_xticklabels()] == ["2", "4"]
    ideal = [line for line in speedup.get_lines() if line.get_label().startswith("ideal")]
    assert ideal and list(ideal[0].get_ydata()) == [2, 4]
    assert speedup.collections, "no p10-p90 band"
    assert any(c.get_label().startswith("oversubscribed") for c in speedup.collections)


def test_throughput_axis_is_labelled_in_k_and_has_a_band():
    runs = [run("local", 1, 2048, 100.0), run("local", 1, 4096, 60.0)]
    for r in runs:
        r.metrics.update({"step_ms": 10.0, "step_ms_p10": 8.0, "step_ms_p90": 12.5})
    ax = figures(runs)["throughput_vs_seq_len"].axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["2K", "4K"]
    band = ax.collections[0].get_paths()[0].vertices[:, 1]
    assert min(band) == 60.0 * 10 / 12.5 and max(band) == 100.0 * 10 / 8.0


def test_measured_vs_analytic_bytes_plot_only_with_the_formula_logged():
    runs = [run("ring", 2, 4096, 1.0), run("ulysses", 2, 4096, 1.0)]
    assert "bytes_measured_vs_analytic" not in figures(runs)
    for r in runs:
        r.metrics["bytes_analytic_per_rank"] = 1.0
    assert "bytes_measured_vs_analytic" in figures(runs)


def test_per_rank_breakdown_splits_each_step_into_compute_waiting_communication():
    from seqpar.sweeps.report.plots import rank_breakdown

    detail = {"per_rank": [{"step_ms": [100.0], "flops": {"forward": 4e9}},
                           {"step_ms": [100.0], "flops": {"forward": 2e9}}]}
    parts = rank_breakdown(detail, rate=1e11)  # 40 ms and 20 ms of compute
    assert parts[0] == pytest.approx({"step": 100.0, "compute": 40.0, "waiting": 0.0,
                                      "communication": 60.0})
    assert parts[1] == pytest.approx({"step": 100.0, "compute": 20.0, "waiting": 20.0,
                                      "communication": 60.0})
    assert rank_breakdown({"per_rank": detail["per_rank"][:1]}, 1e11) is None  # one rank: none


def test_headline_metrics_take_the_best_overall_and_per_algorithm():
    from seqpar.sweeps.report import headline_metrics

    runs = [TrialView.of(run("ring", 2, 4096, 150.0)), TrialView.of(run("ring", 4, 4096, 250.0)),
            TrialView.of(run("ulysses", 2, 4096, 200.0))]
    assert headline_metrics(runs, "tokens_per_s") == {
        "best.tokens_per_s": 250.0, "ring.tokens_per_s": 250.0, "ulysses.tokens_per_s": 200.0}


def test_eta_scales_the_cost_model_by_the_trials_done_and_falls_back_to_the_mean():
    from seqpar.sweeps.progress import Eta

    eta = Eta([10.0, 20.0, 30.0])
    assert eta.remaining_s() == 60.0
    eta.done(20.0)  # twice as slow as predicted
    assert eta.remaining_s() == 100.0
    blind = Eta([None, None, None])  # the cost model cannot predict
    assert blind.remaining_s() is None
    blind.done(4.0)
    assert blind.remaining_s() == 8.0


# ------------------------------------------------------------------ one number format
def test_the_headline_prints_a_metric_as_the_table_does():
    from seqpar.sweeps.report.page import render
    from seqpar.sweeps.report.table import cell, metric_text, table
    from seqpar.sweeps.report.view import SweepView

    runs = [TrialView.of(run("local", 1, 2048, 21062.4)), TrialView.of(run("ring", 2, 2048, 9876.5))]
    cmp = table("sweep s", runs, "tokens_per_s")
    page = render(SweepView("id", "s", "s", 0, {}, "sqlite:///x"), runs, cmp=cmp, pngs={})
    headline = page[page.index('<table id="headline">'):page.index('<table id="comparison">')]
    assert "21,062" in headline and "e+04" not in headline
    assert "21,062" in {r[cmp.columns.index("tok/s")] for r in cmp.rows}
    assert metric_text("peak_mem_bytes", 3 * 2**20) == "3.00 MiB" == cell("peak_mem_bytes",
                                                                        3 * 2**20) + " MiB"
    assert [cell("step_ms", v) for v in (1459.6, 138.14, 12.34, 5.432)] == [
        "1460", "138", "12.3", "5.43"]
