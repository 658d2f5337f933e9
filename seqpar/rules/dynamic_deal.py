"""The dynamic policy's placement: each sequence on a group of a size of the pool's
(`pool.pool_sizes`) — the smallest that holds it (d x capacity >= its length: Megatron-LM's rule),
or sizes chosen by the predicted makespan (`degrees: cost`, `by_cost`) — by a greedy list
scheduler (`placed`: largest groups first, longest work first, each on the group of its size that
finishes it soonest) so the slowest rank is as fast as it can make it; each group packs its
sequences into micro-batches of at most d x capacity. Each placement comes with its lower bound."""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from seqpar.rules.cost_model import CostModel
from seqpar.rules.micro_batches import MicroBatch
from seqpar.rules.packing import best_fit
from seqpar.rules.pool import pool_groups, pool_sizes, smallest_size


def dynamic(lengths: tuple[int, ...], pool: int, capacity: int, cost: CostModel,
             rpn: int | None, any_size: bool, degrees: str = "smallest"
             ) -> tuple[list[MicroBatch], float]:
    """Each sequence on the smallest group that holds it, or (`degrees: cost`) on sizes chosen
    by the predicted makespan; placed by the list scheduler."""
    sizes = pool_sizes(pool, any_size)
    size_of = [smallest_size(n, capacity, sizes) or pool for n in lengths]  # one holds it
    micro, bound = placed(lengths, pool, capacity, cost, rpn, size_of)
    if degrees == "smallest":
        return micro, bound
    got = by_cost(lengths, pool, capacity, cost, rpn, sizes, size_of, micro)
    if any_size:  # powers of two by cost are candidates too: any size never loses to them
        two = dynamic(lengths, pool, capacity, cost, rpn, False, degrees)
        if _makespan(two[0], pool) < _makespan(got[0], pool):
            return two[0], min(got[1], two[1])
    return got


def _makespan(micro: Sequence[MicroBatch], pool: int) -> float:
    free = [0.0] * pool
    for m in micro:
        t = max(free[r] for r in m.group) + m.seconds
        for r in m.group:
            free[r] = t
    return max(free, default=0.0)


# `degrees: cost`: passes over the sequences, each widening the few whose work is largest by one
# size when the step's predicted makespan falls (the smallest-fit deal is the first candidate,
# so it never loses to it in this model)
COST_PASSES = 4
COST_TRIES = 8


def by_cost(lengths: tuple[int, ...], pool: int, capacity: int, cost: CostModel,
             rpn: int | None, sizes: Sequence[int], size_of: list[int],
             micro: list[MicroBatch]) -> tuple[list[MicroBatch], float]:
    """Group sizes by the predicted makespan (greedy: see COST_PASSES), and the lower bound over
    every size each sequence may take: max(the least rank-seconds any sizes need / pool, the
    longest sequence alone on its best size)."""
    best, span = list(size_of), _makespan(micro, pool)
    wider = {d: next((e for e in sizes if e > d), None) for d in sizes}
    for _ in range(COST_PASSES):
        _, one = cost.each(lengths, best)
        improved = False
        for i in sorted(range(len(lengths)), key=lambda i: -one[i])[:COST_TRIES]:
            d = wider[best[i]]
            if d is None:
                continue
            trial = best[:i] + [d] + best[i + 1:]
            got, _ = placed(lengths, pool, capacity, cost, rpn, trial)
            s = _makespan(got, pool)
            if s < span * (1 - 1e-9):
                best, span, micro, improved = trial, s, got, True
        if not improved:
            break
    floor = alone = 0.0
    for i, n in enumerate(lengths):
        options = [d for d in sizes if d >= size_of[i]]
        floor += min(cost.floor(cost.attention_s(n, d), n, d) for d in options)
        alone = max(alone, min(cost.of(cost.attention_s(n, d), n, d) for d in options))
    return micro, max(floor / pool, alone)


def placed(lengths: tuple[int, ...], pool: int, capacity: int, cost: CostModel,
            rpn: int | None, size_of: Sequence[int]) -> tuple[list[MicroBatch], float]:
    """Each sequence on a group of its size `size_of[i]`: the list scheduler (see the module
    docstring), and its lower bound."""
    att, one = cost.each(lengths, size_of)
    by_size: dict[int, list[int]] = {}  # largest size first, longest work first
    for i in sorted(range(len(lengths)), key=lambda i: (size_of[i], one[i]), reverse=True):
        by_size.setdefault(size_of[i], []).append(i)
    free = [0.0] * pool
    assigned: dict[tuple[int, ...], list[int]] = {}
    work = 0.0
    for size, members in by_size.items():
        groups = pool_groups(pool, size, rpn)
        heap = [(max(free[r] for r in g), k) for k, g in enumerate(groups)]  # (finish, group)
        heapq.heapify(heap)
        for i in members:  # each on the group that finishes it soonest (the first on a tie)
            t, k = heapq.heappop(heap)
            assigned.setdefault(groups[k], []).append(i)
            heapq.heappush(heap, (t + one[i], k))
        for t, k in heap:
            for r in groups[k]:
                free[r] = t
        tokens = sum(lengths[i] for i in members)
        work += cost.floor(sum(att[i] for i in members), tokens, size,
                           -(-tokens // (size * capacity)))
    micro = []
    for g in sorted(assigned, key=lambda g: (-len(g), g)):
        for b in best_fit(assigned[g], lengths, len(g) * capacity):
            seconds = cost.of(sum(att[i] for i in b), sum(lengths[i] for i in b), len(g))
            micro.append(MicroBatch(g, tuple(b), len(micro), seconds))
    return micro, max(work / pool, max(one))

