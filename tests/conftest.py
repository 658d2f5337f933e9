"""Shared fixtures: one gang of 8 local gloo ranks serves every multi-rank test (P = 1, 2, 3, 4, 8)."""

from __future__ import annotations

import os
import secrets

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def gang():
    from seqpar.platform.localgang import LocalGang

    with LocalGang(8, sizes=(1, 2, 3, 4), device="cpu") as g:
        yield g


@pytest.fixture(scope="session")
def ray_runner():
    """One TrialRunner on an embedded local Ray (device cpu) shared by every Ray test: Ray start-up
    (~8 s here) is paid once, and gangs are reused across tests of the same experiment id."""
    from seqpar.workers.trial import TrialRunner

    with TrialRunner(device="cpu") as runner:
        yield runner


@pytest.fixture
def seed() -> int:
    """A fresh seed per test, printed on failure so a red run can be replayed."""
    value = secrets.randbelow(2**31)
    print(f"seed={value}")
    return value


@pytest.fixture
def arm_fault(monkeypatch):
    """arm_fault(kind, rank=1, gangs=1): the next `gangs` gangs this process starts get a fault on
    `rank` in their first trial, after the process group is up: 'raise' (the trial raises a
    ValueError, as a bug would), 'die' (the rank's process exits, as on an OOM kill) or 'hang' (the
    rank worker's own `_arm_fault` hook). A retry's fresh gang is healthy once `gangs` are used up."""
    import ray

    from seqpar.platform import cluster

    armed: list[tuple[str, int]] = []
    start_gang = cluster.start_gang

    def patch(worker, kind: str) -> None:  # runs inside the rank actor (pickled by value)
        import os

        def fault() -> None:
            del worker._maybe_fault  # one shot: the class's hook again
            if kind == "die":
                os._exit(1)
            raise ValueError("injected: a deterministic bug in the trial")

        worker._maybe_fault = fault

    def started(*args, **kwargs):
        gang = start_gang(*args, **kwargs)
        if armed:
            kind, rank = armed.pop(0)
            actor = gang.actors[rank]
            ray.get(actor._arm_fault.remote("hang") if kind == "hang"
                    else actor.__ray_call__.remote(patch, kind))
        return gang

    def arm(kind: str, rank: int = 1, gangs: int = 1) -> None:
        assert kind in ("raise", "die", "hang")
        cluster.POOL.evict()  # the next trial starts a gang, whatever is idle
        armed.extend([(kind, rank)] * gangs)

    monkeypatch.setattr(cluster, "start_gang", started)
    return arm
