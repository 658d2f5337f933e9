"""Ray platform tests share the session's `ray_runner` and, through one experiment id, its gang."""

from __future__ import annotations

import time

import pytest

EXPERIMENT = "platform-tests"  # one id: consecutive tests reuse one gang of 4


@pytest.fixture
def experiment() -> str:
    return EXPERIMENT


@pytest.fixture
def assert_no_leaks():
    """Call it to assert (via ray.util.state) that no seqpar actor or placement group is left."""
    from seqpar.platform import cluster

    def check(timeout_s: float = 15.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:  # the state API trails the GCS by a moment
            actors, pgs = cluster.seqpar_actors(), cluster.seqpar_placement_groups()
            if not actors and not pgs:
                return
            assert time.monotonic() < deadline, f"leaked: {actors} {pgs}"
            time.sleep(0.25)

    return check
