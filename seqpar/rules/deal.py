"""The deal of a step's sequences to the pool's sequence-parallel groups: one function that the
runner executes and the planner times.

    cost = CostModel(attention=2e-12, linear=4e-8, comm=1e-9)
    d = deal(lengths, pool=8, capacity=2048, policy="dynamic", cost=cost)
    d.of_rank(3)          # rank 3's micro-batches, in the order every rank follows
    d.makespan, d.lower_bound, d.gap, d.idle_s, d.degrees

Policies (docs/lengths.md):
- `static`: one SP degree (`degree`); sequences packed into micro-batches of at most
  degree x capacity tokens — `best-fit` by tokens (the baselines' rule, packs dealt in turn) or
  `cost-balanced` (WLB-LLM: packs balanced by predicted work); DP over packs, every replica the
  same number of micro-batches.
- `dynamic`: each sequence on the smallest group that holds it (d x capacity >= its length, the
  pool's sizes: `pool.pool_sizes`), a greedy list scheduler (largest groups first, longest work
  first, each on the group of its size that finishes it soonest) so the slowest rank is as fast as
  it can make it; each group packs its sequences into micro-batches of at most d x capacity.

Every rank runs its micro-batches in one global order (`micro`), so blocking collectives on
overlapping groups never wait on each other in a cycle. With `equal_counts` every rank runs the
same number (a rank with nothing in a round runs an empty micro-batch), each micro-batch in the
same round on all its ranks: what FSDP's per-layer gathers over the pool need; a round then lasts
as long as its longest micro-batch (`round_makespan`).

A micro-batch's cost on d ranks (`CostModel`): its attention (attention x visible pairs of each
sequence / d: the sum of L² over documents, not the square of the pack; a short sequence's calls
at the kernel's lower rate with `half`), its SP communication (comm x tokens x (d - 1) / d, or the
planner's rate per group size `comm_at`; hidden under the attention with `overlap`), linear x
tokens / d and the host's issue of a micro-batch on d ranks, `fixed_of(d)` (added to the device's
time on a CPU, overlapping it on a GPU: `host_overlaps`; the planner's rates and counts:
`planner.lengths.deal_cost`). The lower
bound is max(the rank-seconds any packing needs / pool, the longest single micro-batch a sequence
needs); `gap` is the makespan over it, so the optimum is at most that far away. Packing:
`rules.packing`.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property

from seqpar.errors import require
from seqpar.rules.lengths import Distribution, draw_batches
from seqpar.rules.lengths import Sequence as Sequence_
from seqpar.rules.packing import balanced, best_fit, split_to_multiple
from seqpar.rules.pool import pool_groups, pool_sizes, smallest_size

POLICIES = ("static", "dynamic")
DEGREES = ("smallest", "cost")  # the dynamic policy's group sizes: Megatron-LM's rule, or by cost
PACKINGS = ("best-fit", "cost-balanced")


@dataclass(frozen=True)
class CostModel:
    """Predicted seconds of sequences on d ranks (see the module docstring)."""

    attention: float = 1.0     # seconds per visible (query, key) pair, forward + backward
    linear: float = 0.0        # seconds per token: GEMMs, element-wise, the head
    comm: float = 0.0          # seconds per token of SP communication, times (d - 1) / d
    window: int | None = None  # a causal sliding window inside each sequence (None: causal)
    comm_at: tuple[tuple[int, float], ...] = ()  # (d, seconds per token) in place of comm's
    overlap: bool = False      # the communication runs under the attention (a ring's)
    half: float = 0.0          # a call's query tokens (n / d) at which the kernel runs at half rate
    fixed: float = 0.0         # seconds a micro-batch costs whatever it holds (the host's issue)
    fixed_at: tuple[tuple[int, float], ...] = ()  # (d, seconds) in place of fixed's on d ranks
    host_overlaps: bool = False  # the host issues while the device runs (a GPU): a micro-batch
    #                              lasts the longer of the two, not their sum

    def pairs(self, n: int) -> int:
        """Visible pairs of one causal sequence of n tokens (under the window, if any)."""
        w = self.window
        if w is None or w >= n:
            return n * (n + 1) // 2
        return w * (w + 1) // 2 + (n - w) * w

    @cached_property
    def _comm_at(self) -> dict[int, float]:
        return dict(self.comm_at)

    def comm_of(self, d: int) -> float:
        """Seconds per token of a group of d's SP communication."""
        if d == 1:
            return 0.0
        got = self._comm_at.get(d)
        return self.comm * (d - 1) / d if got is None else got

    def attention_s(self, n: int, d: int) -> float:
        """One sequence's attention seconds on each of d ranks."""
        return self.attention * self.pairs(n) * (1.0 + self.half * d / n) / d

    @cached_property
    def _fixed_at(self) -> dict[int, float]:
        return dict(self.fixed_at)

    def fixed_of(self, d: int) -> float:
        """Seconds the host spends issuing a micro-batch on d ranks, whatever it holds."""
        return self._fixed_at.get(d, self.fixed)

    def device(self, attn: float, tokens: int, d: int) -> float:
        """The device's seconds of a micro-batch of `tokens` tokens on d ranks whose attention
        takes `attn` (the host's issue apart)."""
        comm = self.comm_of(d) * tokens
        return (max(attn, comm) if self.overlap else attn + comm) + self.linear * tokens / d

    def of(self, attn: float, tokens: int, d: int) -> float:
        """Seconds of a micro-batch of `tokens` tokens on d ranks whose attention takes `attn`."""
        device, host = self.device(attn, tokens, d), self.fixed_of(d)
        return max(device, host) if self.host_overlaps else device + host

    def seconds(self, lengths: Sequence[int], d: int) -> float:
        return self.of(sum(self.attention_s(n, d) for n in lengths), sum(lengths), d)

    def each(self, lengths: Sequence[int], sizes: Sequence[int]) -> tuple[list[float], list[float]]:
        """(attention seconds, seconds alone) of each sequence on its group size (memoised by
        length and size: a step's lengths repeat)."""
        seen: dict[tuple[int, int], tuple[float, float]] = {}
        att, one = [], []
        for n, d in zip(lengths, sizes, strict=True):
            got = seen.get((n, d))
            if got is None:
                a = self.attention_s(n, d)
                got = seen[(n, d)] = (a, self.of(a, n, d))
            att.append(got[0])
            one.append(got[1])
        return att, one

    def floor(self, attn: float, tokens: int, d: int, packs: int = 0) -> float:
        """Rank-seconds that sequences of `tokens` tokens and attention `attn` on d ranks cost
        however they are packed into at least `packs` micro-batches (a lower bound: the overlap
        does not add up; the host's issue adds, or bounds it where it overlaps the device's)."""
        device, host = d * self.device(attn, tokens, d), packs * d * self.fixed_of(d)
        return max(device, host) if self.host_overlaps else device + host


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


def check_lengths(lengths: Sequence[int], pool: int, capacity: int, policy: str,
                  degree: int | None) -> None:
    """The rules a step's lengths must keep under a policy (one-line ConfigErrors)."""
    require(isinstance(capacity, int) and capacity >= 1, "capacity", capacity,
            "must be a positive number of tokens per rank")
    require(policy in POLICIES, "sp_policy", policy, f"must be one of {', '.join(POLICIES)}")
    longest = max(lengths)
    if policy == "static":
        assert degree is not None
        require(longest <= degree * capacity, "capacity", capacity,
                f"a sequence of {longest} tokens does not fit a static group of {degree} ranks "
                f"x {capacity} tokens = {degree * capacity} (raise the capacity or the SP degree)")
    require(longest <= pool * capacity, "capacity", capacity,
            f"a sequence of {longest} tokens is longer than the whole pool holds: {pool} ranks "
            f"x {capacity} tokens = {pool * capacity}")


def deal(lengths: Sequence[int], pool: int, capacity: int, policy: str, cost: CostModel, *,
         degree: int | None = None, packing: str = "best-fit", equal_counts: bool = False,
         ranks_per_node: int | None = None, any_size: bool = False,
         degrees: str = "smallest", sizes: Sequence[int] | None = None) -> Deal:
    """The step's deal (see the module docstring). `degree`: the static SP degree (dividing the
    pool); `ranks_per_node`: groups that fit a node stay in one; `degrees` (dynamic): each
    sequence on the smallest group that holds it, or sizes chosen by the predicted makespan
    (`cost`); `sizes` (dynamic): each sequence's group size given (a solver's, `planner.degrees`)."""
    lengths = tuple(int(n) for n in lengths)
    require(bool(lengths) and all(n >= 1 for n in lengths), "lengths", list(lengths)[:8],
            "must be positive sequence lengths")
    require(packing in PACKINGS, "packing", packing, f"must be one of {', '.join(PACKINGS)}")
    require(degrees in DEGREES, "degrees", degrees, f"must be one of {', '.join(DEGREES)}")
    require(degrees == "smallest" or policy == "dynamic", "degrees", degrees,
            "chooses the group sizes of the dynamic policy (a static one has one degree)")
    if policy == "static":
        degree = pool if degree is None else degree
        require(isinstance(degree, int) and degree >= 1 and pool % degree == 0, "degree", degree,
                f"the static SP degree must divide the pool ({pool})")
    check_lengths(lengths, pool, capacity, policy, degree)
    if policy == "static":
        assert degree is not None
        micro, bound = _static(lengths, pool, capacity, degree, packing, cost, ranks_per_node)
    else:
        require(packing == "best-fit", "packing", packing,
                "cost-balanced packing is a static policy's (dynamic places by cost already)")
        if sizes is not None:
            require(len(sizes) == len(lengths) and all(
                d in pool_sizes(pool, any_size) and d * capacity >= n
                for d, n in zip(sizes, lengths, strict=True)), "sizes", list(sizes)[:8],
                "must give each sequence a group size of the pool that holds it")
            micro, bound = _placed(lengths, pool, capacity, cost, ranks_per_node, list(sizes))
        else:
            micro, bound = _dynamic(lengths, pool, capacity, cost, ranks_per_node, any_size,
                                    degrees)
    if policy == "static":
        micro = _rounds(micro, pool)
    free = Deal(policy, packing, pool, capacity, lengths, tuple(micro), False, bound)
    return in_rounds(free) if equal_counts else free


def in_rounds(d: Deal) -> Deal:
    """A dynamic deal with equal counts: the same micro-batches in rounds (what `deal` with
    `equal_counts` gives)."""
    return replace(d, micro=tuple(_rounds(d.micro, d.pool)), equal_counts=True)


def _static(lengths: tuple[int, ...], pool: int, capacity: int, degree: int, packing: str,
            cost: CostModel, rpn: int | None) -> tuple[list[MicroBatch], float]:
    room = degree * capacity
    dp = pool // degree
    att, one = cost.each(lengths, [degree] * len(lengths))
    # longest first, the first on a tie (a stable sort keeps ties in order, reversed or not)
    by_length = sorted(range(len(lengths)), key=lengths.__getitem__, reverse=True)
    bins = best_fit(by_length, lengths, room)
    if packing == "cost-balanced":  # WLB-LLM: as many packs, balanced by predicted work
        by_cost = sorted(range(len(lengths)), key=one.__getitem__, reverse=True)
        bins = balanced(by_cost, lengths, one, room, -(-len(bins) // dp) * dp)
    bins = split_to_multiple(bins, dp, lengths)
    groups = pool_groups(pool, degree, rpn)
    per_bin = [cost.of(sum(att[i] for i in b), sum(lengths[i] for i in b), degree) for b in bins]
    share = -(-len(bins) // dp)
    replica_of = _deal_packs(per_bin, dp, share, balanced=packing == "cost-balanced")
    slots = [0] * dp
    micro = []
    for b in sorted(range(len(bins)), key=lambda b: (replica_of[b], b)):
        r = replica_of[b]
        micro.append(MicroBatch(groups[r], tuple(sorted(bins[b])), slots[r], per_bin[b]))
        slots[r] += 1
    micro.sort(key=lambda m: (m.round, m.group))
    packs = -(-sum(lengths) // room)  # at least this many micro-batches, each paying `fixed`
    work = cost.floor(sum(att), sum(lengths), degree, packs)
    return micro, max(work / pool, max(one))


def _deal_packs(per_bin: Sequence[float], dp: int, share: int, balanced: bool) -> list[int]:
    """The replica of each pack: in turn (best-fit's baseline), or longest first to the least
    loaded replica with room (cost-balanced); at most `share` packs a replica."""
    if not balanced:
        return [b % dp for b in range(len(per_bin))]
    heap = [(0.0, r) for r in range(dp)]  # (load, replica) of the replicas with room
    count = [0] * dp
    out = [0] * len(per_bin)
    for b in sorted(range(len(per_bin)), key=lambda b: (-per_bin[b], b)):
        load, r = heapq.heappop(heap)
        out[b] = r
        count[r] += 1
        if count[r] < share:
            heapq.heappush(heap, (load + per_bin[b], r))
    return out


def _dynamic(lengths: tuple[int, ...], pool: int, capacity: int, cost: CostModel,
             rpn: int | None, any_size: bool, degrees: str = "smallest"
             ) -> tuple[list[MicroBatch], float]:
    sizes = pool_sizes(pool, any_size)
    size_of = [smallest_size(n, capacity, sizes) or pool for n in lengths]  # one holds it
    micro, bound = _placed(lengths, pool, capacity, cost, rpn, size_of)
    if degrees == "smallest":
        return micro, bound
    got = _by_cost(lengths, pool, capacity, cost, rpn, sizes, size_of, micro)
    if any_size:  # powers of two by cost are candidates too: any size never loses to them
        two = _dynamic(lengths, pool, capacity, cost, rpn, False, degrees)
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


def _by_cost(lengths: tuple[int, ...], pool: int, capacity: int, cost: CostModel,
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
            got, _ = _placed(lengths, pool, capacity, cost, rpn, trial)
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


def _placed(lengths: tuple[int, ...], pool: int, capacity: int, cost: CostModel,
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


def _rounds(micro: Sequence[MicroBatch], pool: int) -> list[MicroBatch]:
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


@dataclass(frozen=True)
class Batch:
    """One replayed batch of a trial: its sequences and their deal."""

    sequences: tuple[Sequence_, ...]
    deal: Deal


def plan_batches(dist: Distribution, tokens: int, longest: int, seed: int, count: int,
                 pool: int, capacity: int, policy: str, cost: CostModel, **options: object
                 ) -> tuple[Batch, ...]:
    """`count` seeded batches of `tokens` tokens (`lengths.draw_batches`) and the deal of each
    (`deal`, options as it takes them): what the driver makes once and every rank runs."""
    out = []
    for seqs in draw_batches(dist, tokens, longest, seed, count):
        out.append(Batch(seqs, deal([s.length for s in seqs], pool, capacity, policy, cost,
                                    **options)))  # type: ignore[arg-type]
    return tuple(out)
