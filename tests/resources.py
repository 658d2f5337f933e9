"""Session resources of the suite (the shared gloo gang, the embedded Ray runner, the two-node Ray
cluster), each opened by the first test that asks for it and closed right after the last one.

An idle gang is 8 processes whose gloo loop threads (one per process group: dozens per rank once the
meshes are built) wake every few milliseconds; an idle Ray cluster keeps its daemons busy too. On 2
cores that costs every later test much of a core, so a resource lives only while its tests run, and
the gang's tests run first, the embedded Ray's next (`order`). Under `make test`'s two
pytest-xdist workers each resource's tests form a group (`group`) that runs on one worker
(tests/parallel.py). One module, imported by both conftests, holds the state."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

import pytest

# `make test-full` (SEQPAR_TEST_FULL=1): the full products; `make test` runs covering designs of them
FULL = os.environ.get("SEQPAR_TEST_FULL") == "1"

# the fixtures backed by a Shared resource; "gang" also decides the order
SHARED_FIXTURES = ("gang", "ray_runner", "two_nodes")

# The gang id the Ray tests' trials and sweeps share (`gang_id`, `sweeps_share_a_gang`): the
# runner keeps one idle gang and reuses it for a trial of the same key (id, world, env), so a
# test after another of the same world starts no actor (a fresh gang of 2 is ~8 CPU s of imports)
RAY_GANG = "tests"


class Shared:
    """A resource made on first use by `open_()` (a context manager) and closed by `close()`; a
    test that asks for it after that opens it afresh."""

    def __init__(self, open_: Callable[[], contextlib.AbstractContextManager]):
        self._open, self._cm, self.value = open_, None, None

    def get(self) -> Any:
        if self._cm is None:
            cm = self._open()
            self.value = cm.__enter__()
            self._cm = cm
        return self.value

    def close(self) -> None:
        cm, self._cm, self.value = self._cm, None, None
        if cm is not None:
            cm.__exit__(None, None, None)


_open: dict[str, Shared] = {}
# resource -> the last test of the run that uses it
_last_use: dict[str, pytest.Item] = {}


def shared(name: str, open_: Callable[[], contextlib.AbstractContextManager]) -> Any:
    """The session's `name` resource, opened now if it is not open."""
    return _open.setdefault(name, Shared(open_)).get()


def group(item: pytest.Item) -> str | None:
    """The test's pytest-xdist group (`make test`'s two workers, tests/parallel.py), so that a
    resource is made once, on one worker, and closed after its last test there: "gang", "ray"
    (the embedded Ray), "quickstart" (the quickstart sweep and its MLflow server), "two_nodes"; a
    module's path where a fixture of its lives for the module (a `ray start` head); else None,
    any worker."""
    names = item.fixturenames
    if "gang" in names:
        return "gang"
    if "ray_runner" in names:
        return "ray"
    if "quickstart" in names:
        return "quickstart"
    if "two_nodes" in names:
        return "two_nodes"
    defs = item._fixtureinfo.name2fixturedefs.values()
    if any(d[-1].scope in ("module", "class", "package") for d in defs):
        return item.nodeid.split("::")[0]
    return None


def order(items: list[pytest.Item]) -> None:
    """The gang's tests first, then the embedded Ray's and the quickstart's, then the rest (each
    in collection order), so each resource lives while its own tests run and no longer (an idle
    embedded Ray takes about 6% of a core); note each resource's last test."""
    def rank(item: pytest.Item) -> int:
        names = item.fixturenames
        return next((k for k, name in enumerate(("gang", "ray_runner", "quickstart"))
                     if name in names), 3)

    items.sort(key=rank)  # stable: collection order within each
    _last_use.clear()
    for item in items:
        for name in SHARED_FIXTURES:
            if name in item.fixturenames:
                _last_use[name] = item


def close_after(item: pytest.Item) -> None:
    """After `item`'s teardown: close the resources it was the last user of."""
    for name, last in _last_use.items():
        if last is item and name in _open:
            _open[name].close()


def close_all() -> None:
    for resource in _open.values():
        resource.close()
