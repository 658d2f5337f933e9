"""Faults on a real local Ray: a hung rank, a rank killed with SIGKILL, Ctrl-C. Each ends in a clear
state with no seqpar actor or placement group left, and the next trial runs on a fresh gang."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from seqpar.algorithms.comm import LinkModel
from seqpar.case import Case, Trial
from seqpar.platform import cluster
from seqpar.workers.result import FailureKind

pytestmark = pytest.mark.ray

SLOW_LINKS = {"intra": LinkModel(latency_s=0.03), "inter": LinkModel(latency_s=0.03)}


def ring_case(seed: int, iters: int = 2) -> Case:
    # two ranks: each fault costs a fresh gang, and two actors start in half the time of four
    return Case("ring", world=2, batch=1, seq_len=32, heads=2, kv_heads=2, head_dim=8,
                dtype="float32", seed=seed, warmup=0, iters=iters)


def rank_actor(gang_id: str, rank: int):
    import ray

    return ray.get_actor(cluster.actor_name(gang_id, rank), namespace=cluster.NAMESPACE)


def when_measuring(gang_id: str, rank: int, action, phase: str = "measure",
                   settle_s: float = 0.3, again_s: float | None = None) -> threading.Thread:
    """Run action() from a thread as soon as `rank` reports `phase` (by default: inside its timed
    iterations, then `settle_s` later); with `again_s`, again each `again_s` while the rank stays
    in `phase` (until the action has taken: the rank is gone or elsewhere). The rank's actor may
    not exist yet (its gang starts with the trial)."""
    import ray

    def watch() -> None:
        actor = None  # looked up until the gang is there (a trial may be starting it)
        deadline = time.monotonic() + 60
        acted = None
        while time.monotonic() < deadline:
            try:
                actor = actor or rank_actor(gang_id, rank)
                now = ray.get(actor.heartbeat.remote(), timeout=10)["phase"]
            except Exception:  # the actor is gone (the action took) or slow to answer
                if acted is not None:
                    return
                time.sleep(0.05)
                continue
            if now != phase:
                if acted is not None:
                    return
            elif acted is None or (again_s is not None and time.monotonic() - acted > again_s):
                time.sleep(settle_s if acted is None else 0.0)
                action()
                acted = time.monotonic()
                if again_s is None:
                    return
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_injected_hang_is_caught_by_the_timeout_and_the_gang_is_killed(
        ray_runner, gang_id, seed, assert_no_leaks):
    import ray

    assert ray_runner.run(Trial(ring_case(seed), gang_id)).ok  # the gang exists
    ray.get(rank_actor(gang_id, 1)._arm_fault.remote("hang"))
    start = time.monotonic()
    result = ray_runner.run(Trial(ring_case(seed), gang_id, timeout_s=3.0))
    assert result.status == "FAILED"
    assert result.cause.startswith("timeout"), result.cause
    assert result.failure is FailureKind.TIMEOUT and result.failure.retryable
    assert "1 in 'hang (injected)'" in result.cause
    assert time.monotonic() - start < 3.0 + 20.0
    assert_no_leaks()
    again = ray_runner.run(Trial(ring_case(seed), gang_id))
    assert again.status == "FINISHED" and not again.gang_reused, again.cause


def test_rank_killed_mid_trial_fails_with_its_cause_and_leaks_nothing(
        ray_runner, gang_id, seed, assert_no_leaks):
    warm = ray_runner.run(Trial(ring_case(seed), gang_id))
    assert warm.ok, warm.cause
    killed_at: list[float] = []

    def kill_rank_1() -> None:
        os.kill(warm.per_rank[1].extra["pid"], signal.SIGKILL)
        killed_at.append(time.monotonic())

    watcher = when_measuring(gang_id, 1, kill_rank_1)
    result = ray_runner.run(Trial(ring_case(seed, iters=60), gang_id, links=SLOW_LINKS))
    watcher.join(timeout=5)
    assert killed_at, "the trial ended before rank 1 could be killed"
    assert result.status == "FAILED"
    assert result.cause.startswith("rank 1 died"), result.cause
    assert result.failure is FailureKind.RANK_DIED
    assert time.monotonic() - killed_at[0] < 30.0
    assert_no_leaks()
    again = ray_runner.run(Trial(ring_case(seed), gang_id))
    assert again.status == "FINISHED" and not again.gang_reused, again.cause


def test_ctrl_c_during_a_trial_tears_the_gang_down(ray_runner, gang_id, seed, assert_no_leaks):
    """Ctrl-C while a trial runs: the trial cannot end by itself (rank 1 hangs, injected, with a
    long timeout), so the only way out is the KeyboardInterrupt, whatever the host's load."""
    import ray

    assert ray_runner.run(Trial(ring_case(seed), gang_id)).ok
    ray.get(rank_actor(gang_id, 1)._arm_fault.remote("hang"))
    interrupted: list[float] = []

    def ctrl_c(signum, frame) -> None:  # the first Ctrl-C raises; a repeat finds it done
        if not interrupted:
            interrupted.append(time.monotonic())
            raise KeyboardInterrupt

    def press() -> None:
        if not interrupted:
            os.kill(os.getpid(), signal.SIGINT)

    previous = signal.signal(signal.SIGINT, ctrl_c)
    try:  # pressed again each 2 s while rank 1 still hangs and no Ctrl-C has landed yet
        watcher = when_measuring(gang_id, 1, press, phase="hang (injected)", settle_s=0.0,
                                 again_s=2.0)
        with pytest.raises(KeyboardInterrupt):
            ray_runner.run(Trial(ring_case(seed), gang_id, timeout_s=120.0))
        watcher.join(timeout=5)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert_no_leaks()


@pytest.mark.slow  # a raising rank through the CLI: tests/cli/test_cli_on_ray.py
def test_a_rank_that_raises_fails_the_trial_as_rank_raised_and_leaks_nothing(
        ray_runner, gang_id, seed, arm_fault, assert_no_leaks):
    arm_fault("raise", rank=1)
    result = ray_runner.run(Trial(ring_case(seed), gang_id))
    assert result.status == "FAILED" and result.failure is FailureKind.RANK_RAISED
    assert not result.failure.retryable
    assert result.cause.startswith("rank 1 raised ValueError: injected"), result.cause
    assert result.to_dict()["failure"] == "rank_raised"
    assert_no_leaks()
    again = ray_runner.run(Trial(ring_case(seed), gang_id))
    assert again.ok and again.failure is None and not again.gang_reused, again.cause


def test_a_rank_that_dies_is_rank_died(ray_runner, gang_id, seed, arm_fault, assert_no_leaks):
    arm_fault("die", rank=0)
    result = ray_runner.run(Trial(ring_case(seed), gang_id))
    assert result.status == "FAILED" and result.failure is FailureKind.RANK_DIED, result.cause
    assert result.cause.startswith("rank 0 died") and result.failure.retryable
    assert_no_leaks()


def test_a_gang_that_cannot_start_in_time_is_startup(ray_runner, seed, monkeypatch,
                                                     assert_no_leaks):
    # a gang the cluster cannot place: each rank asks for more CPUs than the node has. (A short
    # timeout on a placeable gang instead removes its placement group while Ray may be committing
    # it, which can leave the node's CPUs booked to a group that no longer exists: a later gang
    # then waited out its 180 s in a CI run.)
    monkeypatch.setenv(cluster.READY_TIMEOUT_ENV_VAR, "1")
    monkeypatch.setattr(cluster, "cpu_share", lambda *args, **kwargs: 1024.0)
    result = ray_runner.run(Trial(ring_case(seed), "platform-startup"))
    assert result.status == "FAILED" and result.failure is FailureKind.STARTUP, result.cause
    assert result.cause.startswith("gang start-up failed") and result.failure.retryable
    assert_no_leaks()
