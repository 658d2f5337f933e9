"""The MLflow store as users meet it: where results go, a bad URI, a fresh store used by two
sweeps at once, and what the UI is given to show (experiment kind, trials, the parent's summary)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from seqpar.platform import tracking
from seqpar.platform.tracking import Tracker

ROOT = Path(__file__).resolve().parents[2]


def seqpar(*args: str, cwd: Path, env: dict[str, str] | None = None,
           timeout: float = 120) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    full.update({"PYTHONPATH": str(ROOT), **(env or {})})
    return subprocess.run([sys.executable, "-m", "seqpar.cli.app", *args], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=timeout)


def test_a_bogus_tracking_uri_is_one_line_and_exit_2_before_ray(tmp_path):
    start = time.monotonic()
    out = seqpar("--tracking-uri", "bogus://x", "sweep", str(ROOT / "examples/quickstart.yaml"),
                 cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    expected = "error: tracking-uri='bogus://x': unsupported scheme"
    assert len(lines) == 1 and lines[0].startswith(expected), out.stderr
    assert "Ray" not in out.stderr + out.stdout and "Traceback" not in out.stderr
    print(f"bogus uri rejected in {time.monotonic() - start:.1f} s")


def in_process(monkeypatch, capsys, cwd: Path, *args: str) -> tuple[int, str]:
    """`seqpar ARGS` in this process (the path a user's process takes, without its start-up):
    the exit code and stderr."""
    from seqpar.cli import app as cli_app

    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "argv", ["seqpar", *args])
    with pytest.raises(SystemExit) as info:
        cli_app.main()
    return info.value.code, capsys.readouterr().err


def test_mlflow_tracking_uri_is_the_store_when_no_flag_is_given(tmp_path, monkeypatch, capsys):
    store = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    code, err = in_process(monkeypatch, capsys, tmp_path, "report")
    assert code == 2
    assert f"tracking-uri='{store}': holds no MLflow store" in err
    assert list(tmp_path.iterdir()) == []  # a command that reads makes no store


def test_the_default_store_is_mlflow_db_in_the_working_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    code, err = in_process(monkeypatch, capsys, tmp_path, "compare")
    assert code == 2
    assert f"tracking-uri='sqlite:///{tmp_path.resolve() / 'mlflow.db'}': holds no" in err
    Tracker()  # a command that writes makes it there
    code, err = in_process(monkeypatch, capsys, tmp_path, "compare")
    assert code == 2 and "holds no sweep yet" in err
    assert (tmp_path / "mlflow.db").exists()


CREATE = """
import sys, time
from pathlib import Path
import mlflow  # imported before the barrier: the processes then race on the store alone
from seqpar.platform.tracking import Tracker
uri, barrier, n = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
(barrier / sys.argv[4]).touch()
while len(list(barrier.iterdir())) < n:
    time.sleep(0.01)
Tracker(uri).start_sweep("race", "race", {}, {})
"""


def test_sweeps_started_together_on_a_fresh_store_all_succeed(tmp_path):
    """Two processes create one fresh SQLite store at the same instant (without the lock,
    MLflow's migrations collide: `duplicate column name: step`); all must succeed."""
    uri, barrier, n = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "ready", 2
    barrier.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", CREATE, uri, str(barrier), str(n), str(i)],
                              env=env, stderr=subprocess.PIPE, text=True) for i in range(n)]
    errors = [p.communicate(timeout=180)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * n, "\n".join(e[-600:] for e in errors)
    t = Tracker(uri)
    assert len(t.client.search_runs([t.experiment_id("race", create=False)])) == n


def test_experiments_open_on_runs_and_trials_are_top_level(fresh_store):
    from seqpar.sweeps import report

    t = Tracker(fresh_store)
    sweep = t.start_sweep("ui", "ui", {"sweep.name": "ui"}, {"seqpar.headline": "tokens_per_s"})
    for algo, world, tps in (("local", 1, 100.0), ("ring", 2, 150.0), ("ulysses", 2, 170.0)):
        detail = {"per_rank": [{"step_ms": [10.0, 11.0], "flops": {"forward": 1e6}}] * world}
        t.log_trial(sweep, name=f"{algo}-{world}", spec_hash=algo, status="FINISHED", cause=None,
                    params={"plan.algorithm": algo, "plan.world": world,
                            "workload.seq_len": 1024, "model.heads": 8, "model.kv_heads": 8},
                    metrics={"tokens_per_s": tps, "step_ms": 10.0, "step_ms_p10": 9.0,
                             "step_ms_p90": 12.0, "bytes_total": 4e6, "bytes_intra": 4e6,
                             "bytes_analytic_per_rank": 2e6, "attn_tflops": 1e-4},
                    tags={"seqpar.algorithm": algo}, detail=detail,
                    series={"iter_step_ms": [10.0, 11.0, 12.0]})
    exp = t.client.get_experiment_by_name("ui")
    assert exp.tags[tracking.EXPERIMENT_KIND_TAG] == "custom_model_development"
    trials = t.trials(sweep)
    assert len(trials) == 3 and all(tracking.PARENT_TAG not in r.tags for r in trials)
    assert t.metric_history(trials[0].run_id, "iter_step_ms") == [10.0, 11.0, 12.0]
    runs = report.trials(t.trials(sweep))  # an old sweep, read back
    names = report.log_summary(t, report.SweepView.read(t, sweep), runs,
                               report.per_rank_details(t, runs))
    assert {"bytes_by_link", "bytes_measured_vs_analytic", "per_rank_breakdown"} <= set(names)
    parent = t.client.get_run(sweep)
    assert parent.data.metrics["best.tokens_per_s"] == 170.0
    assert parent.data.metrics["ring.tokens_per_s"] == 150.0
    assert parent.data.tags["seqpar.best_trial"] == "ulysses-2"
    assert {"comparison.json", "report.html", "plots"} <= set(t.artifacts(sweep))


def test_trials_nested_the_old_way_are_still_read(fresh_store):
    t = Tracker(fresh_store)
    sweep = t.start_sweep("old", "old", {}, {})
    t.client.delete_tag(sweep, tracking.LINK_TAG)  # a sweep started before trials were linked
    exp = t.experiment_id("old")
    t.client.create_run(exp, run_name="nested", tags={tracking.PARENT_TAG: sweep,
                                                      tracking.KIND_TAG: "trial"})
    assert [r.name for r in t.trials(sweep)] == ["nested"]


@pytest.mark.parametrize("uri", ["bogus://x", "sqlite:////proc/nope/mlflow.db"])
def test_a_store_that_cannot_open_is_a_config_error(uri):
    from seqpar.errors import ConfigError

    with pytest.raises(ConfigError, match="tracking-uri="):
        Tracker(uri)
