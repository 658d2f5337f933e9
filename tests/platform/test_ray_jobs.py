"""Ray Jobs as the manual shows them, against a head started with `ray start --head` (Ray 2.60, token
authentication on): the job CLI needs RAY_AUTH_MODE=token (without it: "Missing authentication
token", even with the token in RAY_AUTH_TOKEN); a sweep submitted as a job carries its metadata;
its driver killed with SIGKILL leaves no rank actor behind, and a resubmitted `--resume` job
finishes the rest, each trial once."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.platform.conftest import ray_cli

pytestmark = [pytest.mark.ray, pytest.mark.slow]

BIN = Path(sys.executable).parent
ALGORITHMS = ["ring", "ulysses", "allgather", "local"]
SWEEP = {
    "name": "job-kill",
    "base": {"model": {"heads": 2, "kv_heads": 2, "head_dim": 8}, "plan": {"world": 2},
             "workload": {"seq_len": 64, "iters": 60, "warmup": 1, "causal": True},
             # ~0.1 s a pass: a trial lasts long enough to be caught running
             "env": {"device": "cpu", "link_emulation": {
                 "intra": {"latency_us": 30_000, "bandwidth_gb_per_s": 10}}}},
    "grid": {"plan": [{"algorithm": a} if a != "local" else {"algorithm": a, "world": 1}
                      for a in ALGORITHMS]},
}
METADATA = {"seqpar_sweep": "job-kill", "seqpar_study": "", "seqpar_version": "0.1.0"}


def job(head: dict, command: str, *args: str, timeout: float = 300):
    """`ray job COMMAND --address <dashboard> ARGS` (with RAY_AUTH_MODE=token)."""
    return ray_cli("job", command, "--address", head["dashboard"], *args, timeout=timeout)


def rank_actors(head: dict) -> list[dict]:
    out = ray_cli("list", "actors", "--format", "json", "--filter", "state=ALIVE", "--address",
                  head["dashboard"])
    assert out.returncode == 0, out.stderr[-2000:]
    if out.stdout.startswith("No resource"):  # what the CLI prints for an empty list
        return []
    return [a for a in json.loads(out.stdout) if (a.get("name") or "").startswith("seqpar:")]


def test_the_job_cli_needs_token_mode_against_a_ray_start_head(ray_head):
    token = (Path.home() / ".ray" / "auth_token").read_text().strip()
    bare = ray_cli("job", "submit", "--address", ray_head["dashboard"], "--", "echo", "hello",
                   token=False)
    assert bare.returncode != 0 and "Missing authentication token" in bare.stdout + bare.stderr
    os.environ["RAY_AUTH_TOKEN"] = token  # the token alone is not enough either
    try:
        alone = ray_cli("job", "submit", "--address", ray_head["dashboard"], "--", "echo",
                        "hello", token=False)
    finally:
        del os.environ["RAY_AUTH_TOKEN"]
    assert alone.returncode != 0 and "Missing authentication token" in alone.stdout + alone.stderr
    ok = job(ray_head, "submit", "--", "echo", "hello")
    assert ok.returncode == 0 and "hello" in ok.stdout, ok.stdout[-2000:] + ok.stderr[-2000:]


def test_a_sweep_job_whose_driver_is_killed_leaves_no_rank_and_resume_finishes_once(
        ray_head, tmp_path):
    from seqpar.platform.tracking import Tracker

    work = tmp_path / "work"  # what --working-dir uploads: the sweep file
    work.mkdir()
    (work / "sweep.yaml").write_text(json.dumps(SWEEP))
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    # as the manual writes it: the working dir, the ranks' variables, the job's metadata
    entry = ["--working-dir", str(work),
             "--runtime-env-json", json.dumps({"env_vars": {"NCCL_SOCKET_IFNAME": "lo"}}),
             "--", str(BIN / "seqpar"), "--tracking-uri", uri, "sweep", "sweep.yaml"]
    submitted = job(ray_head, "submit", "--no-wait", "--submission-id", "sweep-1",
                    "--metadata-json", json.dumps(METADATA), *entry)
    assert submitted.returncode == 0, submitted.stderr[-2000:]
    # wait until two trials are in the store and a gang runs the third, then SIGKILL the driver
    deadline, sweep_id, runs = time.monotonic() + 240, None, []
    while len(runs) < 2 or not rank_actors(ray_head):
        assert time.monotonic() < deadline, job(ray_head, "logs", "sweep-1").stdout[-3000:]
        time.sleep(1)
        logs = job(ray_head, "logs", "sweep-1").stdout
        sweep_id = sweep_id or next((ln.split()[2].rstrip(":") for ln in logs.splitlines()
                                     if ln.startswith("sweep id ")), None)
        runs = Tracker(uri).trials(sweep_id) if sweep_id else []
    jobs = json.loads(ray_cli("list", "jobs", "--detail", "--format", "json", "--address",
                              ray_head["dashboard"]).stdout)
    (mine,) = [j for j in jobs if j.get("submission_id") == "sweep-1"]
    assert {k: mine["metadata"].get(k) for k in METADATA} == METADATA
    assert mine["status"] == "RUNNING", "the sweep ended before its driver could be killed"
    os.kill(int(mine["driver_info"]["pid"]), signal.SIGKILL)
    killed = time.monotonic()
    while rank_actors(ray_head):  # the ranks belong to the driver's job: they go with it
        assert time.monotonic() - killed < 60, rank_actors(ray_head)
        time.sleep(1)
    left_after_s = time.monotonic() - killed
    status = job(ray_head, "status", "sweep-1")
    assert "Job 'sweep-1' failed" in status.stdout + status.stderr, status.stdout[-2000:]
    # the same sweep again, as a job: only what had not FINISHED runs
    again = job(ray_head, "submit", "--submission-id", "sweep-2", *entry, "--resume", sweep_id)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-2000:]
    done_before = sum(r.status == "FINISHED" for r in runs)
    assert f"{len(ALGORITHMS) - done_before} run, {done_before} already done, 0 failed" in \
        again.stdout, again.stdout[-2000:]
    trials = Tracker(uri).trials(sweep_id)
    assert sorted(r.params["plan.algorithm"] for r in trials) == sorted(ALGORITHMS)
    assert {r.status for r in trials} == {"FINISHED"}
    assert rank_actors(ray_head) == []
    print(f"rank actors gone {left_after_s:.1f} s after the driver's SIGKILL")
