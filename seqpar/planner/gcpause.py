"""The cyclic garbage collector paused while a search runs (`gc_paused`): a search builds hundreds
of thousands of objects it keeps (predictions, steps, their memos) and next to none that refer to
each other in a cycle, so every collection walks live objects for nothing (a tenth of a plan's
run at 1,024 GPUs); reference counting frees what it drops all the same. On the way out what the
search built joins the oldest generation unwalked (`gc.freeze` then `gc.unfreeze`), as a
collection would have moved it there after walking it once more (not where the process froze
objects of its own: those stay frozen)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """The collector off inside, as it was after (a decorator too: `@gc_paused()`)."""
    was, frozen = gc.isenabled(), gc.get_freeze_count()
    gc.disable()
    try:
        yield
    finally:
        if not frozen:
            gc.freeze()
            gc.unfreeze()
        if was:
            gc.enable()
