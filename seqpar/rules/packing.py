"""Packing sequences into micro-batches of bounded tokens, for the deal (`rules.deal`).

    best_fit(order, lengths, room)                 # [[i, ...], ...]: the fullest pack each fits
    balanced(order, lengths, work, room, count)    # WLB-LLM: the least loaded pack with room
    split_to_multiple(packs, dp, lengths)          # as many packs as a multiple of dp

Each keeps its packs in a sorted list or a heap, so a step of thousands of sequences packs in
milliseconds; ties go to the first pack, as a linear scan would.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Sequence


def best_fit(order: Sequence[int], lengths: Sequence[int], room: int) -> list[list[int]]:
    """Best-fit packing by tokens: each sequence (in `order`) into the fullest pack it fits (the
    first on a tie), a new pack of `room` tokens when none has room."""
    packs: list[list[int]] = []
    # (room left, pack) as one integer, left * m + pack (packs < m): sorted as the pairs would
    # be, and compared faster; the first with room for n is the first at n * m or above
    m = len(order) + 1
    free: list[int] = []
    for i in order:
        n = lengths[i]
        k = bisect.bisect_left(free, n * m)
        if k < len(free):
            left, b = divmod(free.pop(k), m)
            packs[b].append(i)
            bisect.insort(free, (left - n) * m + b)
        else:
            packs.append([i])
            bisect.insort(free, (room - n) * m + len(packs) - 1)
    return packs


def balanced(order: Sequence[int], lengths: Sequence[int], work: Sequence[float], room: int,
             count: int) -> list[list[int]]:
    """WLB-LLM's variable-length packing: `count` packs (more when none has room), each sequence
    (in `order`) into the least loaded pack by `work` that has room for it (the first on a tie);
    empty packs dropped."""
    packs: list[list[int]] = [[] for _ in range(count)]
    left = [room] * count
    heap = [(0.0, b) for b in range(count)]
    order = list(order)
    least = [0] * len(order)  # the shortest sequence still to place, from each place on
    low = room + 1
    for k in range(len(order) - 1, -1, -1):
        low = min(low, lengths[order[k]])
        least[k] = low
    for k, i in enumerate(order):
        n, skipped = lengths[i], []
        while heap and left[heap[0][1]] < n:
            full = heapq.heappop(heap)
            if left[full[1]] >= least[k]:  # a pack no sequence left fits is done with
                skipped.append(full)
        if heap:
            load, b = heapq.heappop(heap)
        else:
            load, b = 0.0, len(packs)
            packs.append([])
            left.append(room)
        packs[b].append(i)
        left[b] -= n
        heapq.heappush(heap, (load + work[i], b))
        for s in skipped:
            heapq.heappush(heap, s)
    return [p for p in packs if p]


def split_to_multiple(packs: list[list[int]], dp: int, lengths: Sequence[int]) -> list[list[int]]:
    """Split the packs holding most sequences (the first on a tie; the longest and every other
    one stay) until their count is a multiple of dp, so that every replica runs as many; packs of
    one sequence cannot split (the deal's rounds add empty ones)."""
    packs = [list(p) for p in packs]
    heap = [(-len(p), k) for k, p in enumerate(packs)]
    heapq.heapify(heap)
    while len(packs) % dp and heap:
        size, b = heapq.heappop(heap)
        if -size != len(packs[b]):
            continue  # a stale entry: the pack was split since
        if -size < 2:
            break
        ordered = sorted(packs[b], key=lambda i: -lengths[i])
        packs[b], new = ordered[0::2], ordered[1::2]
        packs.append(new)
        heapq.heappush(heap, (-len(packs[b]), b))
        heapq.heappush(heap, (-len(new), len(packs) - 1))
    return packs
