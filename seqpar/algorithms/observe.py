"""Who waits in what: `observed(callback)` makes `callback(what)` hear, in the calling thread's
context, each blocking communication before it blocks (`"all_to_all on sp"`, `"p2p wait on cp"`:
`comm.py` announces them) and None once it returns. The rank actor above sets one, so its heartbeat
can say which collective a stuck rank is in; with none set an announcement costs one lookup."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar

Observer = Callable[[str | None], None]
_observer: ContextVar[Observer | None] = ContextVar("seqpar_comm_observer", default=None)


@contextlib.contextmanager
def observed(callback: Observer) -> Iterator[None]:
    """Within this block (this thread's context), tell `callback` what each operation waits in."""
    token = _observer.set(callback)
    try:
        yield
    finally:
        _observer.reset(token)


@contextlib.contextmanager
def waiting(what: str) -> Iterator[None]:
    """Announce `what` to the observer (if any) for the duration of the block."""
    callback = _observer.get()
    if callback is None:
        yield
        return
    callback(what)
    try:
        yield
    finally:
        callback(None)
