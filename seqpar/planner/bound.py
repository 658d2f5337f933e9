"""The search's branch and bound (`search.search` with `keep`): an attention configuration's bound
is the best TGS any policy could give it (`exact`: a step per states choice, no recompute, no
offload, no tiling); its `ceiling` is a cheap number no lower (the compute a step cannot go under),
so `Frontier` hands configurations out by bound, highest first, taking the exact bound only of
those whose ceiling could still come first. Most configurations of a large plan cannot reach the
top: their bounds are never taken.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Generic, TypeVar

from seqpar.planner.api import Prediction
from seqpar.planner.net import ByIdentity
from seqpar.planner.policy import Policy
from seqpar.planner.step import Setup, Step, class_time, head_time, host_once, layer_kinds, step

T = TypeVar("T")
# a ceiling's margin over the step's own arithmetic (its sums run in another order)
SLACK = 1e-9


def exact(setup: Setup, dp: int, sp: int, p: Prediction, policies: Sequence[Policy],
          steps: dict[tuple[int, Policy], Step] | None = None) -> float:
    """The best TGS any policy could give this attention configuration: no recompute, no offload,
    no tiling (each only adds time), over every states choice searched. `steps` keeps the steps
    timed, by (id(p), policy): the search times them again when `p` is timed in full."""
    best = []
    for st, e in _states_of(policies):
        policy = _plain(st, e)
        s = step(setup, dp, sp, p, policy)
        if steps is not None:
            steps[(id(p), policy)] = s
        best.append(s.tgs)
    return max(best)


def ceiling(setup: Setup, dp: int, sp: int, p: Prediction, policies: Sequence[Policy]) -> float:
    """A TGS no policy gives this configuration more of (`exact`'s, or more): a step lasts at
    least its micro-batches' compute without recompute — every class of layers' GEMMs and
    element-wise work, its attention with the attention's own exposed communication, the head —
    of which a backward hides at most the queued waits (`step.step`'s `hidden`, at most 2/3 of
    the last micro-batch)."""
    kinds = layer_kinds(setup, sp, p)
    m, world = setup.micro_batches(dp), dp * sp
    least = float("inf")
    for st, e in _states_of(policies):
        compute = head_time(setup, sp)
        for cl in setup.classes:
            g, _, ew = class_time(setup, sp, cl.first, e if cl.moe else 1)
            compute += cl.count * (3 * (g + ew) + kinds[cl.kind].attention_ms / 1e3)
        queued = host_once(setup, _plain(st, e).train(setup.dtype).states, world)[1]
        least = min(least, (m - 1) * compute + max(compute - queued, compute / 3))
    return setup.step_tokens(dp) / (least * world) * (1 + SLACK)


def _states_of(policies: Sequence[Policy]) -> list[tuple[str, int]]:
    """The (states, ep) choices among `policies`, once a list (a split's configurations share
    their lists of policies)."""
    return _STATES.get(policies, lambda: list(dict.fromkeys((q.states, q.ep) for q in policies)))


_STATES = ByIdentity()


@lru_cache(maxsize=256)
def _plain(states: str, ep: int) -> Policy:
    """The policy of no recompute, no offload, no tiling under `states` and `ep`."""
    return Policy(states, "none", ep=ep)


class Frontier(Generic[T]):
    """Items by their exact bound, highest first (ties: in the order given), each exact bound
    taken (`exact(item)`) only once the item's ceiling, which is no lower, leads every other
    item's ceiling or exact bound."""

    def __init__(self, items: Sequence[tuple[float, T]], exact: Callable[[T], float] | None):
        self._exact = exact  # None: the ceilings are exact
        self._heap = [(-top, i, exact is None, item) for i, (top, item) in enumerate(items)]
        heapq.heapify(self._heap)

    def pop(self) -> tuple[float, T] | None:
        """(exact bound, item) of the item with the highest exact bound; None when none is left."""
        while self._heap:
            top, i, known, item = heapq.heappop(self._heap)
            if known:
                return -top, item
            assert self._exact is not None
            heapq.heappush(self._heap, (-self._exact(item), i, True, item))
        return None

    def rest(self) -> list[T]:
        """The items not handed out yet."""
        return [item for *_, item in self._heap]
