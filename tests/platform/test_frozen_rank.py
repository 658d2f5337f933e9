"""A frozen rank (its process stopped with SIGSTOP: what a hung GPU or a wedged NIC leaves) is named:
the cause says which rank on which node stopped answering, in which phase, and what its peers wait
in; the trial ends when the rank has been silent for SEQPAR_HEARTBEAT_SILENT_S, before its
timeout; the gang is killed, the stopped process included, and the next trial gets a fresh gang.
On one Ray node here (the session's Ray); on two real Ray nodes through the CLI, with `--resume`
rerunning the hit trial, in make test-full."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from seqpar.case import Trial
from seqpar.workers.heartbeats import SILENT_ENV_VAR, WATCH_S
from seqpar.workers.result import FailureKind
from tests.platform.conftest import subprocess_env
from tests.platform.test_ray_faults import SLOW_LINKS, rank_actor, ring_case, when_measuring

pytestmark = pytest.mark.ray

SILENT_S = 4.0  # short here: nothing else loads these two ranks' heartbeats for that long


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_frozen_rank_is_named_ends_the_trial_early_and_is_killed(
        ray_runner, gang_id, seed, monkeypatch, assert_no_leaks):
    import ray

    monkeypatch.setenv(SILENT_ENV_VAR, str(SILENT_S))
    frozen: list[tuple[int, float]] = []

    def freeze() -> None:
        pid = ray.get(rank_actor(gang_id, 1).heartbeat.remote(), timeout=10)["pid"]
        os.kill(pid, signal.SIGSTOP)
        frozen.append((pid, time.monotonic()))

    # stopped once the driver has heard it measuring (it asks every WATCH_S); the next trial's
    # fresh gang after a failure: tests/platform/test_ray_faults.py
    watcher = when_measuring(gang_id, 1, freeze, settle_s=2 * WATCH_S + 0.5)
    try:
        result = ray_runner.run(Trial(ring_case(seed, iters=400), gang_id, links=SLOW_LINKS,
                                      timeout_s=120.0))
        ended = time.monotonic()
    finally:
        watcher.join(timeout=5)
        for pid, _ in frozen:
            if not gone(pid):
                os.kill(pid, signal.SIGCONT)
    assert frozen, "the trial ended before rank 1 could be stopped"
    pid, frozen_at = frozen[0]
    assert result.failure is FailureKind.TIMEOUT and result.failure.retryable, result.cause
    node = ray.util.get_node_ip_address()
    assert result.cause.startswith(f"rank 1 on node {node} ("), result.cause
    assert "stopped answering in 'measure'" in result.cause
    assert "; rank 0 waiting (" in result.cause, result.cause  # in which collective
    # silent for SILENT_S, noticed within two heartbeat rounds; far inside the 120 s timeout
    assert SILENT_S <= ended - frozen_at < SILENT_S + 3 * WATCH_S + 20, ended - frozen_at
    deadline = time.monotonic() + 10
    while not gone(pid):  # SIGKILL takes a stopped process too
        assert time.monotonic() < deadline, f"rank 1 (pid {pid}) left {psutil.Process(pid).status()}"
        time.sleep(0.1)
    assert_no_leaks()


# -- two real Ray nodes, through the CLI -------------------------------------------------------
BIN = Path(sys.executable).parent
TWO_NODE_SWEEP = {
    "name": "frozen",
    "base": {"model": {"heads": 4, "kv_heads": 4, "head_dim": 8},
             "plan": {"world": 4, "nodes": 2, "layout": "contiguous"},
             "workload": {"seq_len": 64, "causal": False, "dtype": "float32", "warmup": 1,
                          "iters": 120},
             # ~0.1 s a pass: a trial lasts long enough to be caught running
             "env": {"device": "cpu", "timeout_s": 120, "link_emulation": {
                 "intra": {"latency_us": 20_000, "bandwidth_gb_per_s": 10},
                 "inter": {"latency_us": 20_000, "bandwidth_gb_per_s": 10}}}},
    "grid": {"plan.algorithm": ["ring", "ulysses", "allgather", "burst"]},
}
WATCHER = """
import json, os, signal, sys, time
from ray.util.state import list_actors, list_tasks
address, victim = sys.argv[1], sys.argv[2]
deadline = time.monotonic() + 240
while time.monotonic() < deadline:
    try:
        tasks = list_tasks(address=address, filters=[("state", "=", "RUNNING")],
                           raise_on_missing_output=False)
        hit = [t for t in tasks if (t.name or "").startswith(victim)
               and (t.func_or_class_name or "").endswith(".run_trial")]
        if hit:
            time.sleep(4.5)  # inside its timed iterations, heard there by the driver (every 2 s)
            actors = {a.name: a for a in list_actors(address=address, detail=True,
                                                     raise_on_missing_output=False)}
            rank = next(a for n, a in actors.items() if n.endswith(":rank-2")
                        and a.state == "ALIVE")
            os.kill(rank.pid, signal.SIGSTOP)
            print(json.dumps({"pid": rank.pid, "node": rank.node_id, "at": time.time(),
                              "repr": rank.repr_name}), flush=True)
            break
    except Exception as err:
        print(f"{type(err).__name__}: {err}"[:500], file=sys.stderr, flush=True)
    time.sleep(0.3)
"""


@pytest.mark.slow
def test_a_frozen_rank_on_two_nodes_is_named_and_resume_reruns_only_its_trial(
        two_nodes, tmp_path):
    from seqpar.platform.tracking import Tracker

    (tmp_path / "frozen.yaml").write_text(json.dumps(TWO_NODE_SWEEP))
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = {**subprocess_env(), SILENT_ENV_VAR: "20"}
    sweep = [str(BIN / "seqpar"), "--address", two_nodes.gcs, "--tracking-uri", uri, "sweep",
             str(tmp_path / "frozen.yaml")]
    watcher = subprocess.Popen([sys.executable, "-c", WATCHER, two_nodes.dashboard, "ulysses"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    first = subprocess.run(sweep, capture_output=True, text=True, env=env, timeout=420)
    try:
        out, err = watcher.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        watcher.kill()
        out, err = watcher.communicate()
    assert out.strip(), f"no rank was stopped: {err[-2000:]}\n{first.stderr[-2000:]}"
    frozen = json.loads(out.strip().splitlines()[-1])
    try:
        assert first.returncode == 1, first.stdout[-2000:] + first.stderr[-3000:]
        sweep_id = next(w for ln in first.stdout.splitlines() if ln.startswith("sweep id ")
                        for w in [ln.split()[2]])
        (hit,) = [r for r in Tracker(uri).trials(sweep_id) if r.status != "FINISHED"]
        assert hit.params["plan.algorithm"] == "ulysses" and hit.tags["seqpar.failure"] == "timeout"
        cause = hit.tags["seqpar.cause"]
        assert "rank 2 on node " in cause and f"({frozen['node'][:8]})" in cause, cause
        assert "stopped answering in 'measure'" in cause and "ranks 0, 1, 3 waiting" in cause
        assert frozen["repr"].startswith("RankWorker(sweep=frozen ") and "rank=2/4" in frozen["repr"]
        # from the freeze to the trial's run logged: the silence threshold, not the 120 s timeout
        took = Tracker(uri).client.get_run(hit.run_id).info.end_time / 1e3 - frozen["at"]
        assert 20 <= took < 60, took
        assert gone(frozen["pid"]), "the stopped rank outlived its gang"
        print(f"cause: {cause}; freeze to the trial's end {took:.1f} s")
        again = subprocess.run([*sweep, "--resume", sweep_id], capture_output=True, text=True,
                               env=env, timeout=300)
        assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
        assert "1 run, 3 already done, 0 failed" in again.stdout, again.stdout[-2000:]
        runs = Tracker(uri).trials(sweep_id)
        assert sorted(r.params["plan.algorithm"] for r in runs) == sorted(
            TWO_NODE_SWEEP["grid"]["plan.algorithm"])
        assert {r.status for r in runs} == {"FINISHED"}
    finally:
        if not gone(frozen["pid"]):
            os.kill(frozen["pid"], signal.SIGCONT)
