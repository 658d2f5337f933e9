"""Unstable trials on a real local Ray with a real (temporary) MLflow store: the interval metrics,
the `seqpar.unstable` tag (absent when stable), `--rerun-unstable`, and `compare --baseline`.

Whether this shared host is quiet is not the test's to decide: the thresholds are set so that only
the noise the test injects (a hypervisor's steal on a trial's first round) can mark a trial."""

from __future__ import annotations

import math

import pytest

from seqpar.platform.tracking import Tracker
from seqpar.sweeps import report, runner, spec
from seqpar.sweeps.report.baseline import against
from seqpar.sweeps.report.view import TrialView
from seqpar.workers import stability

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("sweeps_share_a_gang")]  # one gang of 2

ONE = {"name": "one",
       "base": {"model": {"heads": 2, "kv_heads": 2, "head_dim": 8}, "plan": {"world": 2},
                "workload": {"iters": 4, "warmup": 1, "seq_len": 64}, "env": {"device": "cpu"}},
       "grid": {"plan.algorithm": ["ring"]}}


@pytest.fixture
def tracker(fresh_store) -> Tracker:
    return Tracker(fresh_store)


@pytest.fixture
def steal(monkeypatch):
    """Only injected steal marks a trial; `steal(rounds)` injects it into the first `rounds`
    rounds of each trial (every round: a large number). Returns the rounds run per trial."""
    monkeypatch.setattr(stability, "MAX_HALF_WIDTH", math.inf)
    monkeypatch.setattr(stability, "MAX_OTHERS_CPU", math.inf)
    monkeypatch.setattr(stability, "MAX_STEAL", 0.5)
    ran: list[int] = []
    real = runner.run_one

    def arm(rounds: int) -> list[int]:
        def run_one(point, *args, **kwargs):
            result, attempts = real(point, *args, **kwargs)
            ran.append(1)
            if len(ran) <= rounds:
                for m in result.per_rank:
                    m.noise["host_steal_s"] = 100 * m.noise["wall_s"] * m.noise["host_cores"]
                result.finish(result.per_rank)  # as if the ranks had reported it
            return result, attempts

        monkeypatch.setattr(runner, "run_one", run_one)
        return ran

    return arm


@pytest.mark.slow
def test_a_stable_trial_logs_its_interval_and_no_unstable_tag(ray_runner, tracker, steal):
    ran = steal(0)
    outcome = runner.run_sweep(spec.parse(ONE), tracker=tracker, runner=ray_runner,
                               progress=False, rerun_unstable=3)
    (run,) = tracker.trials(outcome.sweep_id)
    m = run.metrics
    assert m["step_ms_ci_low"] <= m["step_ms"] <= m["step_ms_ci_high"]
    assert m["step_ms_samples"] == 4 and 0 <= m["noise_others_cpu_frac"] <= 1
    assert m["noise_ranks_per_core"] > 0 and m["noise_steal_frac"] < 0.5
    assert "seqpar.unstable" not in run.tags and "seqpar.rounds" not in run.tags
    assert len(ran) == 1  # stable: never measured again


def test_a_busy_host_marks_the_trial_unstable_with_its_reason_in_mlflow(ray_runner, tracker, steal):
    ran = steal(99)
    outcome = runner.run_sweep(spec.parse(ONE), tracker=tracker, runner=ray_runner,
                               progress=False)
    (run,) = tracker.trials(outcome.sweep_id)
    assert run.tags["seqpar.unstable"].startswith("steal")
    assert run.metrics["noise_steal_frac"] > 0.5 and "step_ms_ci_high" in run.metrics
    assert len(ran) == 1 and "seqpar.rounds" not in run.tags  # no --rerun-unstable: one round
    cmp = report.comparison(tracker, sweep=outcome.sweep_id)
    (row,) = cmp.rows
    assert row[cmp.columns.index("unstable")] == stability.short_reason(
        run.tags["seqpar.unstable"])
    assert "--rerun-unstable" in cmp.legend and cmp.legend.startswith("flags: U unstable")
    assert row[cmp.columns.index("flags")] == "U"
    page = report.build_page(tracker, outcome.sweep_id)
    assert "0 of 1 trials stable" in page and 'class="unstable"' in page


def test_rerun_unstable_measures_again_until_a_round_is_stable(ray_runner, tracker, steal):
    ran = steal(1)  # the first round is noisy, the second quiet
    outcome = runner.run_sweep(spec.parse(ONE), tracker=tracker, runner=ray_runner,
                               progress=False, rerun_unstable=3)
    (run,) = tracker.trials(outcome.sweep_id)
    assert len(ran) == 2 and run.tags["seqpar.rounds"] == "2"
    assert "seqpar.unstable" not in run.tags and run.metrics["noise_steal_frac"] < 0.5


@pytest.mark.slow
def test_rerun_unstable_stops_at_its_round_limit_and_keeps_the_reason(ray_runner, tracker, steal):
    ran = steal(99)
    outcome = runner.run_sweep(spec.parse(ONE), tracker=tracker, runner=ray_runner,
                               progress=False, rerun_unstable=2)
    (run,) = tracker.trials(outcome.sweep_id)
    assert len(ran) == 3 and run.tags["seqpar.rounds"] == "3"
    assert run.tags["seqpar.unstable"].startswith("steal")


def trial(algorithm: str, world: int, lo: float, hi: float,
          unstable: str | None = None) -> TrialView:
    return TrialView(f"{algorithm}-{world}", algorithm, "FINISHED", algorithm, (), world, "1",
                     "zigzag", 1024, 8, 8, "float32", True, None, None, None, 2, "cpu", "virtual",
                     "", None, {"step_ms": (lo + hi) / 2, "step_ms_ci_low": lo,
                                "step_ms_ci_high": hi}, unstable)


def test_compare_baseline_prints_ratios_and_no_measurable_difference_where_intervals_overlap():
    runs = [trial("local", 1, 100, 110), trial("ring", 4, 40, 44),
            trial("ulysses", 4, 105, 120, unstable="host busy 40% (detail)"),
            trial("allgather", 4, 130, 150)]
    cmp = against("sweep q", runs, "local")
    rows = {r[0]: dict(zip(cmp.columns, r, strict=True)) for r in cmp.rows}
    assert rows["local"]["verdict"] == "baseline" and rows["local"]["time ratio"] == "1.00"
    assert rows["ring"]["verdict"].startswith("faster") and rows["ring"]["time ratio"] == "0.40"
    assert rows["ring"]["ratio 95% CI"] == f"{40 / 110:.2f}-{44 / 100:.2f}"
    assert rows["ulysses"]["verdict"] == stability.NO_DIFFERENCE  # 105-120 overlaps 100-110
    assert rows["ulysses"]["unstable"] == "this: host busy 40%"
    assert rows["allgather"]["verdict"].startswith("slower")
    with pytest.raises(Exception, match="--baseline"):
        against("sweep q", runs, "burst")


def test_plots_draw_unstable_trials_hollow_and_the_interval_as_the_band():
    from dataclasses import replace

    from seqpar.sweeps import style
    from seqpar.sweeps.report.plots import figures

    runs = []
    for n, shaky in ((1024, None), (2048, "host busy 90% (detail)")):
        t = replace(trial("ring", 2, 10.0 * n / 1024, 11.0 * n / 1024, shaky), seq_len=n)
        t.metrics["tokens_per_s"] = n / (t.metrics["step_ms"] / 1e3)
        runs.append(t)
    figs = figures(runs)
    try:
        assert "memory_vs_seq_len" not in figs  # no trial measured it: no empty figure
        ax = figs["throughput_vs_seq_len"].axes[0]
        hollow = [c for c in ax.collections if len(c.get_offsets()) and
                  tuple(c.get_facecolors()[0][:3]) == (1.0, 1.0, 1.0)]
        assert len(hollow) == 1 and [tuple(p) for p in hollow[0].get_offsets()] == [
            (2048, pytest.approx(runs[1].metrics["tokens_per_s"]))]
        band = ax.collections[0].get_paths()[0].vertices[:, 1]  # fill_between: the interval
        low = runs[0].metrics["tokens_per_s"] * runs[0].metrics["step_ms"] / 11.0
        assert min(band) == pytest.approx(low)
    finally:
        style.close(figs.values())
