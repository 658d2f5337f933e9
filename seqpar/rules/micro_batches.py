"""What a deal is (`Deal`): micro-batches of a step's sequences on groups of pool ranks
(`MicroBatch`), in the one global order every rank follows, so blocking collectives on
overlapping groups never wait on each other in a cycle; its free schedule (each micro-batch starts
when all its ranks are free) and what it measures: makespan, busy and idle seconds, imbalance, the
gap to the lower bound. With equal counts (`in_rounds`) every rank runs the same number (a rank
with nothing in a round runs an empty micro-batch), each micro-batch in the same round on all its
ranks: what FSDP's per-layer gathers over the pool need; a round then lasts as long as its longest
micro-batch (`round_makespan`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property


@dataclass(frozen=True)
class MicroBatch:
    """Sequences (indices into the step's lengths, in pack order) on one group of pool ranks."""

    group: tuple[int, ...]
    seqs: tuple[int, ...]
    round: int            # its place in every member's order (rounds are equal under equal_counts)
    seconds: float        # predicted

    @property
    def size(self) -> int:
        return len(self.group)


@dataclass(frozen=True)
class Deal:
    policy: str
    packing: str
    pool: int
    capacity: int
    lengths: tuple[int, ...]
    micro: tuple[MicroBatch, ...]   # in the one global order every rank follows
    equal_counts: bool
    lower_bound: float

    @cached_property
    def _by_rank(self) -> tuple[tuple[int, ...], ...]:
        out: list[list[int]] = [[] for _ in range(self.pool)]
        for i, m in enumerate(self.micro):
            for r in m.group:
                out[r].append(i)
        return tuple(tuple(x) for x in out)

    def of_rank(self, rank: int) -> tuple[MicroBatch, ...]:
        """This rank's micro-batches, in the order it runs them."""
        return tuple(self.micro[i] for i in self._by_rank[rank])

    @cached_property
    def _schedule(self) -> tuple[tuple[float, ...], tuple[float, ...], float]:
        """(busy seconds per rank, finish time per rank, makespan) of the free schedule: each
        micro-batch starts when all its ranks are free, in the global order."""
        free = [0.0] * self.pool
        busy = [0.0] * self.pool
        for m in self.micro:
            start = max(free[r] for r in m.group)
            for r in m.group:
                free[r] = start + m.seconds
                busy[r] += m.seconds
        return tuple(busy), tuple(free), max(free, default=0.0)

    @property
    def busy_s(self) -> tuple[float, ...]:
        return self._schedule[0]

    @property
    def makespan(self) -> float:
        """Predicted step seconds of the free schedule."""
        return self._schedule[2]

    @property
    def round_makespan(self) -> float:
        """Predicted step seconds when every round waits for its longest micro-batch (FSDP)."""
        longest: dict[int, float] = {}
        for m in self.micro:
            longest[m.round] = max(longest.get(m.round, 0.0), m.seconds)
        return sum(longest.values())

    @property
    def idle_s(self) -> tuple[float, ...]:
        return tuple(self.makespan - b for b in self.busy_s)

    @property
    def gap(self) -> float:
        """Makespan over the lower bound (1.0: optimal)."""
        return self.makespan / self.lower_bound if self.lower_bound > 0 else 1.0

    @property
    def imbalance(self) -> float:
        """Max over mean of the ranks' busy seconds (1.0: balanced)."""
        mean = sum(self.busy_s) / self.pool
        return max(self.busy_s) / mean if mean > 0 else 1.0

    @property
    def degrees(self) -> dict[int, int]:
        """Group size -> sequences run on groups of that size."""
        out: Counter[int] = Counter()
        for m in self.micro:
            out[len(m.group)] += len(m.seqs)
        return {d: n for d, n in sorted(out.items()) if n}

    @property
    def counts(self) -> tuple[int, ...]:
        """Micro-batches per rank."""
        return tuple(len(x) for x in self._by_rank)

def in_rounds(d: Deal) -> Deal:
    """A dynamic deal with equal counts: the same micro-batches in rounds (what `deal` with
    `equal_counts` gives)."""
    return replace(d, micro=tuple(rounds(d.micro, d.pool)), equal_counts=True)


def rounds(micro: Sequence[MicroBatch], pool: int) -> list[MicroBatch]:
    """The same micro-batches in rounds: each in the first round all its ranks have free, in the
    global order; every rank padded with empty one-rank micro-batches to the same count."""
    nxt = [0] * pool
    placed: list[MicroBatch] = []
    for m in micro:
        k = max(nxt[r] for r in m.group)
        for r in m.group:
            placed += [MicroBatch((r,), (), j, 0.0) for j in range(nxt[r], k)]
            nxt[r] = k + 1
        placed.append(MicroBatch(m.group, m.seqs, k, m.seconds))
    last = max(nxt)
    for r in range(pool):
        placed += [MicroBatch((r,), (), j, 0.0) for j in range(nxt[r], last)]
    placed.sort(key=lambda m: (m.round, m.group[0]))
    return placed


