"""`seqpar report` as a newcomer runs it after `seqpar run STUDY`: one line on the terminal (no
MLflow download progress bars), and a page whose advice for unstable trials is the command that
ran the sweep, not `seqpar sweep FILE`."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from seqpar.cli.app import app
from seqpar.platform.tracking import Tracker
from seqpar.sweeps import record
from seqpar.sweeps import spec as sweep_spec
from seqpar.sweeps.report.view import SweepView

SHAKY = "host busy 41% (other processes' share of the host's CPU time, > 10%, load 0.9)"


def _log_study_sweep(tracker: Tracker, source: str, preset: str, sets: dict[str, str]) -> str:
    """A sweep as `seqpar run` logs one (its params say how it was run), two trials of two ranks
    (each with its per_rank.json), one of them unstable."""
    sweep = tracker.start_sweep("load-balance", "load-balance",
                                {"sweep.source": source, "sweep.preset": preset,
                                 **{f"sweep.set.{k}": v for k, v in sets.items()}},
                                {"seqpar.headline": "tokens_per_s", "seqpar.study": "load-balance"})
    for i, algorithm in enumerate(("ring", "ulysses")):
        step = 10.0 + i
        tracker.log_trial(
            sweep, name=f"{algorithm} P=2", spec_hash=algorithm,
            params={"plan.algorithm": algorithm, "plan.world": 2, "workload.seq_len": 1024,
                    "model.heads": 4, "model.kv_heads": 4},
            metrics={"step_ms": step, "step_ms_ci_low": step * 0.9, "step_ms_ci_high": step * 1.1,
                     "tokens_per_s": 1024 / step * 1e3},
            tags={"seqpar.device": "cpu", **({"seqpar.unstable": SHAKY} if i else {})},
            status="FINISHED", cause=None,
            detail={"per_rank": [{"step_ms": [step], "flops": {"attention": 1.0}}] * 2})
    tracker.end_sweep(sweep)
    return sweep


@pytest.mark.parametrize(("source", "preset", "sets", "command"), [
    ("study:load-balance", "cpu", {}, "seqpar run load-balance --rerun-unstable 2"),
    ("study:load-balance", "gpu-cluster", {"workload.seq_len": "1024"},
     "seqpar run load-balance --preset gpu-cluster --set workload.seq_len=1024 --rerun-unstable 2"),
    ("examples/mine.yaml", "cpu", {}, "seqpar sweep examples/mine.yaml --rerun-unstable 2"),
])
def test_report_is_quiet_and_advises_the_command_that_ran_the_sweep(
        fresh_store, tmp_path, monkeypatch, source, preset, sets, command):
    monkeypatch.chdir(tmp_path)
    _log_study_sweep(Tracker(fresh_store), source, preset, sets)
    result = CliRunner().invoke(app, ["--tracking-uri", fresh_store, "report", "--no-log"])
    assert result.exit_code == 0, result.output
    assert "Downloading artifacts" not in result.output and "it/s" not in result.output
    assert result.output.splitlines()[0].startswith("wrote report.html"), result.output
    page = (tmp_path / "report.html").read_text()
    assert f"<code>{command}</code>" in page
    assert "seqpar sweep FILE" not in page


def test_a_finished_sweeps_own_page_names_the_command_that_ran_it(fresh_store):
    """The page a sweep logs when it ends (made from memory, not read back) says the same."""
    tracker = Tracker(fresh_store)
    plan = sweep_spec.from_study("load-balance", "cpu", {"workload.seq_len": 1024})
    view, _ = record.start(plan, tracker, None)
    assert view.command == "seqpar run load-balance --set workload.seq_len=1024"
    assert SweepView.read(tracker, view.sweep_id).command == view.command
