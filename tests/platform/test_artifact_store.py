"""A full or unwritable artifact store never costs a measurement (a real local Ray, a real MLflow
store): every trial FINISHED with its metrics, one warning naming where and why, the missing
artifacts listed at the end, the per-rank breakdown from the runs' own metrics, `seqpar report`
drawing the figures again once there is room, and no run left RUNNING. The store fills two ways:
an artifact repository that raises ENOSPC after N writes, and a real tmpfs (mounted here as root,
as CI runs; skipped with the reason where `mount` is refused)."""

from __future__ import annotations

import errno
import io
import subprocess
import sys

import pytest
from rich.console import Console

from seqpar.cli import app as cli_app
from seqpar.platform import cluster, metrics
from seqpar.platform.tracking import Tracker
from seqpar.sweeps import report, spec
from seqpar.sweeps.runner import run_sweep

pytestmark = pytest.mark.ray

SCHEME = "fullafter"


def plan_of(name: str, algorithms: list[str]):
    return spec.parse({"name": name, "base": {
        "model": {"heads": 2, "kv_heads": 2, "head_dim": 8}, "plan": {"world": 2},
        "workload": {"seq_len": 32, "iters": 2, "warmup": 0}, "env": {"device": "cpu"}},
        "grid": {"plan.algorithm": algorithms}})


def repository():
    """A local artifact repository whose disk fills after `left` writes (None: never)."""
    from mlflow.store.artifact.local_artifact_repo import LocalArtifactRepository

    class FullAfter(LocalArtifactRepository):
        left: int | None = None

        def __init__(self, artifact_uri: str, *args, **kwargs):
            super().__init__("file" + artifact_uri[len(SCHEME):], *args, **kwargs)

        def _write(self) -> None:
            if FullAfter.left is not None:
                if FullAfter.left <= 0:
                    raise OSError(errno.ENOSPC, "No space left on device")
                FullAfter.left -= 1

        def log_artifact(self, local_file, artifact_path=None):
            self._write()
            super().log_artifact(local_file, artifact_path)

        def log_artifacts(self, local_dir, artifact_path=None):
            self._write()
            super().log_artifacts(local_dir, artifact_path)

    return FullAfter


@pytest.fixture
def full_after():
    from mlflow.store.artifact.artifact_repository_registry import _artifact_repository_registry

    repo = repository()
    _artifact_repository_registry.register(SCHEME, repo)
    yield repo
    repo.left = None


def cli(monkeypatch, capsys, uri: str, *args: str) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["seqpar", "--tracking-uri", uri, *args])
    with pytest.raises(SystemExit) as info:
        cli_app.main()
    return info.value.code, capsys.readouterr().out


def no_run_running(tracker: Tracker) -> list[str]:
    exps = [e.experiment_id for e in tracker.client.search_experiments()]
    return [r.info.run_id for r in tracker.client.search_runs(exps, "attributes.status = 'RUNNING'")]


def test_a_full_artifact_store_loses_no_measurement_and_report_draws_again(
        ray_runner, fresh_store, full_after, tmp_path, monkeypatch, capsys):
    plan = plan_of("full-disk", ["ring", "ulysses", "allgather"])
    tracker = Tracker(fresh_store)
    tracker.client.create_experiment(plan.experiment, artifact_location=f"{SCHEME}://{tmp_path}/art")
    full_after.left = 3  # plan.json, the sweep file, the first trial's per_rank.json
    console = Console(file=io.StringIO(), width=400)
    seen: list[tuple[dict, dict]] = []

    def look(trial) -> None:  # while the sweep runs: the driver's counts and the actors' reprs
        import time

        sweep_id = trial.run.tags["seqpar.sweep_id"]
        deadline, counts = time.monotonic() + 10, {}
        while counts.get("done") != len(seen) + 1:
            assert time.monotonic() < deadline, counts
            time.sleep(0.3)
            counts = {x.tags["status"]: x.value for x in metrics.scrape(metrics.endpoints(
                __import__("ray").nodes())) if x.name == "ray_seqpar_sweep_trials"
                and x.tags.get("sweep") == sweep_id[:8]}
        reprs = {a.name: a.repr_name for a in cluster.seqpar_actors(detail=True)
                 if a.name.startswith(f"seqpar:sweep-{sweep_id[:8]}")}
        seen.append((counts, reprs))

    outcome = run_sweep(plan, tracker=tracker, runner=ray_runner, progress=False,
                        console=console, on_trial_end=look)
    text = console.file.getvalue()
    sweep_id = outcome.sweep_id
    # every trial FINISHED with its measurements; the sweep FINISHED; nothing RUNNING
    runs = tracker.trials(sweep_id)
    assert [r.status for r in runs] == ["FINISHED"] * 3
    assert all(r.metrics["step_ms"] > 0 and "rank_step_ms" in r.metrics for r in runs)
    assert tracker.sweep(sweep_id).status == "FINISHED" and no_run_running(tracker) == []
    # one warning, naming where and why; the end lists what is missing and how to redraw
    warnings = [ln for ln in text.splitlines() if "warning:" in ln]
    assert len(warnings) == 1, text
    assert f"{tmp_path}/art/" in warnings[0] and "per_rank.json" in warnings[0]
    assert "No space left on device" in warnings[0]
    assert "per_rank.json of 2 trial(s)" in text and "report.html" in text
    assert f"seqpar report {sweep_id}" in text and "Traceback" not in text
    # the driver's counts while it ran; the ranks' repr names the sweep and the rank
    assert [c for c, _ in seen] == [{"done": n, "failed": 0, "pending": 3 - n} for n in (1, 2, 3)]
    gang = f"sweep-{sweep_id[:8]}"
    assert seen[0][1] == {cluster.actor_name(gang, r): f"RankWorker(sweep=full-disk {sweep_id[:8]}, "
                          f"rank={r}/2)" for r in range(2)}
    # the report: the breakdown of the two trials without per_rank.json from their metrics
    details = report.per_rank_details(tracker, report.trials(runs))
    assert sorted(d.get("source", "artifact") for d in details.values()) == [
        "artifact", "metrics", "metrics"]
    page, pngs, _ = report.build_with_figures(tracker, sweep_id)
    assert "per_rank_breakdown" in pngs and "per_rank.json is missing for 2 trial(s)" in page
    # space is back: `seqpar report` stores the page and the figures on the sweep's run
    full_after.left = None
    code, out = cli(monkeypatch, capsys, fresh_store, "report", sweep_id, "-o",
                    str(tmp_path / "report.html"))
    assert code == 0 and "stored report.html" in out, out
    assert "plots/per_rank_breakdown.png" in tracker.artifacts(sweep_id, "plots")


@pytest.fixture
def tmpfs(tmp_path):
    """mount(tmp_path / 'mlartifacts', options): a small tmpfs as the store's artifact root."""
    mounted = []

    def mount(options: str):
        path = tmp_path / "mlartifacts"
        path.mkdir(exist_ok=True)
        out = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                             capture_output=True, text=True)
        if out.returncode != 0:
            pytest.skip(f"`mount -t tmpfs` refused ({out.stderr.strip()}): needs root, as CI has")
        mounted.append(path)
        return path

    yield mount
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def test_a_full_tmpfs_leaves_the_trial_finished_with_its_metrics_and_names_the_file(
        tmpfs, fresh_store, tmp_path):
    root = tmpfs("size=64k")
    tracker = Tracker(fresh_store)
    sweep_id = tracker.start_sweep("tmpfs", "tmpfs", {}, {})
    big = {"per_rank": [{"step_ms": [1.0] * 20_000}]}  # ~200 KB: more than the volume holds
    run = tracker.log_trial(sweep_id, name="t", spec_hash="abc", params={"p": 1},
                            metrics={"step_ms": 2.0}, tags={}, status="FINISHED", cause=None,
                            detail=big, by_rank={"rank_step_ms": [1.0, 3.0]})
    stored = tracker.client.get_run(run.run_id)
    assert stored.info.status == "FINISHED" and stored.data.metrics["step_ms"] == 2.0
    assert tracker.metric_history(run.run_id, "rank_step_ms") == [1.0, 3.0]
    (missing,) = tracker.missing
    assert missing.path == "per_rank.json" and missing.where.startswith(str(root))
    assert "No space left on device" in missing.error


@pytest.mark.slow  # the same one-line warning as a full store (the test above), at the start
def test_an_unwritable_artifact_root_is_one_line_and_the_sweep_runs(
        ray_runner, tmpfs, fresh_store):
    root = tmpfs("ro,size=64k")
    console = Console(file=io.StringIO(), width=400)
    outcome = run_sweep(plan_of("read-only", ["ring"]), tracker=Tracker(fresh_store),
                        runner=ray_runner, progress=False, console=console)
    text = console.file.getvalue()
    assert [t.status for t in outcome.trials] == ["FINISHED"]
    (warning,) = [ln for ln in text.splitlines() if "warning:" in ln]
    assert str(root) in warning and "Read-only file system" in warning, warning
    assert "Traceback" not in text
