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
