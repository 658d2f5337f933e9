"""Sweeps on a real local Ray with a real (temporary) MLflow store: logging, resume, retries."""

from __future__ import annotations

import json

import pytest

from seqpar.errors import ConfigError
from seqpar.platform.tracking import Tracker
from seqpar.sweeps import report, spec
from seqpar.sweeps.runner import run_sweep

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("sweeps_share_a_gang")]  # one gang of 2

MINI = {"name": "mini",
        "base": {"model": {"heads": 4, "kv_heads": 2, "head_dim": 8}, "plan": {"world": 2},
                 "workload": {"iters": 2, "warmup": 1}, "env": {"device": "cpu"}},
        "grid": {"plan.algorithm": ["ring", "ulysses", "allgather"], "workload.seq_len": [64, 128]}}


def _counted(method, name: str, calls: list[str]):
    def wrapper(*args, **kwargs):
        calls.append(name)
        return method(*args, **kwargs)
    return wrapper


@pytest.fixture
def tracker(fresh_store) -> Tracker:
    return Tracker(fresh_store)


def test_each_trial_is_a_child_run_logged_when_it_ends(ray_runner, tracker, tmp_path):
    plan = spec.parse(MINI)
    seen: list[int] = []

    logged_runs = {}

    def count_logged(trial) -> None:  # the trial is in MLflow before the next one starts
        seen.append(len(tracker.trials(trial_sweep[0])))
        logged_runs[trial.run_id] = trial.run

    trial_sweep: list[str] = []
    original = tracker.start_sweep
    reads: list[str] = []  # what the runner reads back from the store: nothing (it logged it)
    for name in ("trials", "download", "sweep", "latest_sweep"):
        setattr(tracker, name, _counted(getattr(tracker, name), name, reads))

    def start_sweep(*args, **kwargs):
        trial_sweep.append(original(*args, **kwargs))
        return trial_sweep[0]

    tracker.start_sweep = start_sweep
    outcome = run_sweep(plan, tracker=tracker, runner=ray_runner, progress=False,
                        on_trial_end=count_logged)
    assert seen == [1, 2, 3, 4, 5, 6]
    assert reads == ["trials"] * 6, reads  # count_logged's own, one per trial
    runs = tracker.trials(outcome.sweep_id)
    assert len(runs) == 6 and {r.status for r in runs} == {"FINISHED"}
    for run in runs:
        assert run.metrics["step_ms"] > 0 and run.metrics["tokens_per_s"] > 0
        assert run.metrics["bytes_total"] > 0 and "load_imbalance" in run.metrics
        assert run.params["plan.world"] == "2" and run.params["model.kv_heads"] == "2"
        for tag in ("seqpar.spec_hash", "seqpar.git_commit", "seqpar.torch_version",
                    "seqpar.ray_version", "seqpar.host", "seqpar.device"):
            assert run.tags[tag], tag
        assert tracker.artifacts(run.run_id) == ["per_rank.json"]
        assert run.tags["seqpar.kernel"] == run.params["trial.kernel"] == "torch-cpu-flash"
        assert run.tags["seqpar.gemm_dtype"] == "float32"
        logged = logged_runs[run.run_id]
        assert logged.metrics == run.metrics and logged.params == run.params  # as it was logged
        kept = next(t.view for t in outcome.trials if t.run_id == run.run_id)
        assert kept.metrics == run.metrics  # what the sweep keeps: the view, not the record
    path = tracker.client.download_artifacts(runs[0].run_id, "per_rank.json", str(tmp_path))
    detail = json.loads(open(path).read())
    assert len(detail["per_rank"]) == 2 and detail["status"] == "FINISHED"
    parent = tracker.sweep(outcome.sweep_id)
    assert parent.status == "FINISHED" and parent.tags["seqpar.headline"] == "tokens_per_s"
    assert set(tracker.artifacts(outcome.sweep_id)) == {"plan.json", "plots", "comparison.json",
                                                       "report.html", "report.csv", "sweep"}
    plots = {a.path for a in tracker.client.list_artifacts(outcome.sweep_id, "plots")}
    assert "plots/throughput_vs_seq_len.png" in plots and "plots/bytes_by_link.png" in plots

    cmp = report.comparison(tracker, sweep=outcome.sweep_id)
    assert len(cmp.rows) == 6
    tps = [t.metrics["tokens_per_s"] for t in report.trials(runs)]  # best: its row, in row order
    assert cmp.trials[cmp.best].metrics["tokens_per_s"] == max(tps)
    by_step = report.comparison(tracker, metric="step_ms")
    assert by_step.trials[by_step.best].metrics["step_ms"] == min(
        t.metrics["step_ms"] for t in report.trials(runs))
    assert len(report.comparison(tracker, study="mini").rows) == 6
    with pytest.raises(ConfigError, match="metric='speed'"):
        report.comparison(tracker, metric="speed")


# before the failing sweeps: it takes the first sweep's idle gang (a failure kills a gang)
def test_a_long_sweep_keeps_views_logs_without_searching_and_resumes_with_one_search(
        ray_runner, tracker):
    """A covering size of issue 39's long sweep (32 tiny trials, past a screen; the 1,000-trial
    run is benchmarks/sweep_scale.py): the driver keeps each trial's view, the per-rank records
    of a dozen at most; logging never searches the store; the comparison is the digest; a resume
    with every trial done finds them with one search."""
    from seqpar.sweeps.report import digest

    plan = spec.parse({**MINI, "name": "long", "grid": {
        "plan.algorithm": ["ring", "ulysses", "allgather", "usp"],
        "workload.seq_len": [64 + 16 * i for i in range(8)]}})
    searches: list[str] = []
    tracker.client.search_runs = _counted(tracker.client.search_runs, "search", searches)
    outcome = run_sweep(plan, tracker=tracker, runner=ray_runner, progress=False)
    assert len(outcome.trials) == 32 and searches == []
    assert 0 < len(outcome.kept) <= 12 and all(not hasattr(t, "result") for t in outcome.trials)
    cmp = digest.screen(report.table("long", outcome.views(), "tokens_per_s"))
    assert len(cmp.rows) == 8 and "the winner of each group by N" in cmp.title
    assert any(n.startswith("wins ") for n in cmp.notes) and any("--all" in n for n in cmp.notes)
    assert "report.csv" in tracker.artifacts(outcome.sweep_id)

    again = run_sweep(plan, tracker=tracker, runner=ray_runner, progress=False,
                      resume=outcome.sweep_id)
    assert again.resumed == 32 and again.trials == [] and searches == ["search"]


@pytest.mark.slow  # resume through the CLI: tests/cli/test_cli_on_ray.py
def test_interrupted_sweep_resumes_with_only_the_rest_and_no_duplicates(ray_runner, tracker):
    plan = spec.parse({**MINI, "grid": {**MINI["grid"], "workload.seq_len": [64]}})  # 3 trials
    done: list[str] = []

    def interrupt_after_two(trial) -> None:
        done.append(trial.run_id)
        if len(done) == 2:
            raise KeyboardInterrupt  # Ctrl-C between trials

    with pytest.raises(KeyboardInterrupt):
        run_sweep(plan, tracker=tracker, runner=ray_runner, progress=False,
                  on_trial_end=interrupt_after_two)
    sweep_id = tracker.latest_sweep().run_id
    assert tracker.sweep(sweep_id).status == "KILLED"
    assert len(tracker.trials(sweep_id)) == 2

    outcome = run_sweep(plan, tracker=tracker, runner=ray_runner, progress=False, resume=sweep_id)
    assert outcome.resumed == 2 and len(outcome.trials) == 1
    runs = tracker.trials(sweep_id)
    hashes = [r.tags["seqpar.spec_hash"] for r in runs]
    assert len(runs) == 3 and len(set(hashes)) == 3
    assert set(hashes) == {p.spec.hash for p in plan.trials}
    assert tracker.sweep(sweep_id).status == "FINISHED"

    again = run_sweep(plan, tracker=tracker, runner=ray_runner, progress=False, resume=sweep_id)
    assert again.resumed == 3 and again.trials == []
    other = spec.parse({**MINI, "name": "elsewhere"})
    with pytest.raises(ConfigError, match="resume"):
        run_sweep(other, tracker=tracker, runner=ray_runner, progress=False, resume=sweep_id)


def test_failed_trial_is_retried_then_logged_failed_with_its_cause(ray_runner, tracker):
    # a 10 ms budget cannot cover a process-group rendezvous: a real timeout, every time
    plan = spec.parse({**MINI, "name": "doomed", "grid": {"plan.algorithm": ["ring"]},
                       "base": {**MINI["base"], "workload": {"seq_len": 64},
                                "env": {"device": "cpu", "timeout_s": 0.01}}})
    outcome = run_sweep(plan, tracker=tracker, runner=ray_runner, retries=1, progress=False)
    (run,) = tracker.trials(outcome.sweep_id)
    assert run.status == "FAILED" and run.tags["seqpar.attempts"] == "2"
    assert run.tags["seqpar.cause"] and "step_ms" not in run.metrics
    assert len(outcome.failed) == 1
    assert tracker.sweep(outcome.sweep_id).tags["seqpar.failed"] == "1"


@pytest.mark.slow
def test_tuning_profiles_every_valid_configuration_and_logs_it_as_a_sweep(ray_runner, tracker):
    from seqpar.sweeps.tune import tuning_plan

    plan = tuning_plan(2, "tiny", 128, iters=1, layouts=("zigzag",))
    outcome = run_sweep(plan, tracker=tracker, runner=ray_runner, progress=False)
    assert tracker.experiment_name(tracker.sweep(outcome.sweep_id)) == "tune"
    runs = tracker.trials(outcome.sweep_id)
    assert len(runs) == len(plan.trials)
    ok = {r.params["plan.algorithm"] for r in runs if r.status == "FINISHED"}
    assert {"ring", "ulysses", "allgather"} <= ok
    cmp = report.comparison(tracker, sweep=outcome.sweep_id, metric="tokens_per_s")
    best = max((r for r in runs if r.status == "FINISHED"), key=lambda r: r.metrics["tokens_per_s"])
    assert cmp.rows[cmp.best][0] == report.TrialView.of(best).config
