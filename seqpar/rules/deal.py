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

A micro-batch's cost is (attention x visible pairs + linear x tokens) / d + comm x tokens x
(d - 1) / d, summed over its sequences: attention follows the sum of L² over
documents, not the square of the pack (the rates come from the planner's model). The lower bound
is max(total rank-seconds / pool, the longest single micro-batch a sequence needs); `gap` is the
makespan over it, so the optimum is at most that far away.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from seqpar.errors import require
from seqpar.rules.lengths import Distribution, draw_batches
from seqpar.rules.lengths import Sequence as Sequence_
from seqpar.rules.pool import pool_groups, pool_sizes, smallest_size

POLICIES = ("static", "dynamic")
PACKINGS = ("best-fit", "cost-balanced")


@dataclass(frozen=True)
class CostModel:
    """Predicted seconds of a sequence of L tokens on d ranks (see the module docstring)."""

    attention: float = 1.0     # seconds per visible (query, key) pair, forward + backward
    linear: float = 0.0        # seconds per token: GEMMs, element-wise, the head
    comm: float = 0.0          # seconds per token of SP communication, times (d - 1) / d
    window: int | None = None  # a causal sliding window inside each sequence (None: causal)

    def pairs(self, n: int) -> int:
        """Visible pairs of one causal sequence of n tokens (under the window, if any)."""
        w = self.window
        if w is None or w >= n:
            return n * (n + 1) // 2
        return w * (w + 1) // 2 + (n - w) * w

    def seconds(self, lengths: Sequence[int], d: int) -> float:
        work = sum(self.attention * self.pairs(n) + self.linear * n for n in lengths) / d
        return work + self.comm * sum(lengths) * (d - 1) / d


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

    def of_rank(self, rank: int) -> tuple[MicroBatch, ...]:
        """This rank's micro-batches, in the order it runs them."""
        return tuple(m for m in self.micro if rank in m.group)

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
        return dict(sorted(Counter(m.size for m in self.micro for _ in m.seqs).items()))

    @property
    def counts(self) -> tuple[int, ...]:
        """Micro-batches per rank."""
        return tuple(len(self.of_rank(r)) for r in range(self.pool))


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
         ranks_per_node: int | None = None, any_size: bool = False) -> Deal:
    """The step's deal (see the module docstring). `degree`: the static SP degree (dividing the
    pool); `ranks_per_node`: groups that fit a node stay in one."""
    lengths = tuple(int(n) for n in lengths)
    require(bool(lengths) and all(n >= 1 for n in lengths), "lengths", list(lengths)[:8],
            "must be positive sequence lengths")
    require(packing in PACKINGS, "packing", packing, f"must be one of {', '.join(PACKINGS)}")
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
        micro, bound = _dynamic(lengths, pool, capacity, cost, ranks_per_node, any_size)
    if equal_counts or policy == "static":
        micro = _rounds(micro, pool)
    return Deal(policy, packing, pool, capacity, lengths, tuple(micro), equal_counts, bound)


def _best_fit(order: Sequence[int], lengths: Sequence[int], room: int) -> list[list[int]]:
    """Best-fit packing by tokens: each sequence (in `order`) into the fullest bin it fits."""
    bins: list[list[int]] = []
    left: list[int] = []
    for i in order:
        fits = [b for b in range(len(bins)) if left[b] >= lengths[i]]
        if fits:
            b = min(fits, key=lambda k: (left[k], k))
            bins[b].append(i)
            left[b] -= lengths[i]
        else:
            bins.append([i])
            left.append(room - lengths[i])
    return bins


def _static(lengths: tuple[int, ...], pool: int, capacity: int, degree: int, packing: str,
            cost: CostModel, rpn: int | None) -> tuple[list[MicroBatch], float]:
    room = degree * capacity
    dp = pool // degree
    one = [cost.seconds((n,), degree) for n in lengths]
    by_length = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins = _best_fit(by_length, lengths, room)
    if packing == "cost-balanced":  # WLB-LLM: as many packs, balanced by predicted work
        count = -(-len(bins) // dp) * dp
        bins = [[] for _ in range(count)]
        load, left = [0.0] * count, [room] * count
        for i in sorted(range(len(lengths)), key=lambda i: (-one[i], i)):
            fits = [b for b in range(len(bins)) if left[b] >= lengths[i]]
            if not fits:
                bins.append([])
                load.append(0.0)
                left.append(room)
                fits = [len(bins) - 1]
            b = min(fits, key=lambda k: (load[k], k))
            bins[b].append(i)
            load[b] += one[i]
            left[b] -= lengths[i]
        bins = [b for b in bins if b]
    bins = _split_to_multiple(bins, dp, lengths)
    groups = pool_groups(pool, degree, rpn)
    per_bin = [cost.seconds([lengths[i] for i in b], degree) for b in bins]
    share = -(-len(bins) // dp)
    replica_of = _deal_packs(per_bin, dp, share, balanced=packing == "cost-balanced")
    slots = [0] * dp
    micro = []
    for b in sorted(range(len(bins)), key=lambda b: (replica_of[b], b)):
        r = replica_of[b]
        micro.append(MicroBatch(groups[r], tuple(sorted(bins[b])), slots[r], per_bin[b]))
        slots[r] += 1
    micro.sort(key=lambda m: (m.round, m.group))
    bound = max(sum(one) * degree / pool, max(one))
    return micro, bound


def _split_to_multiple(bins: list[list[int]], dp: int, lengths: Sequence[int]) -> list[list[int]]:
    """Split the packs holding most sequences until their count is a multiple of dp (so that every
    replica runs as many); packs of one sequence cannot split (the rounds add empty ones)."""
    bins = [list(b) for b in bins]
    while len(bins) % dp:
        b = max(range(len(bins)), key=lambda k: (len(bins[k]), -k))
        if len(bins[b]) < 2:
            break
        ordered = sorted(bins[b], key=lambda i: -lengths[i])
        bins[b], new = ordered[0::2], ordered[1::2]
        bins.append(new)
    return bins


def _deal_packs(per_bin: Sequence[float], dp: int, share: int, balanced: bool) -> list[int]:
    """The replica of each pack: in turn (best-fit's baseline), or longest first to the least
    loaded replica with room (cost-balanced); at most `share` packs a replica."""
    if not balanced:
        return [b % dp for b in range(len(per_bin))]
    load, count = [0.0] * dp, [0] * dp
    out = [0] * len(per_bin)
    for b in sorted(range(len(per_bin)), key=lambda b: (-per_bin[b], b)):
        r = min((r for r in range(dp) if count[r] < share), key=lambda r: (load[r], r))
        out[b] = r
        load[r] += per_bin[b]
        count[r] += 1
    return out


def _dynamic(lengths: tuple[int, ...], pool: int, capacity: int, cost: CostModel,
             rpn: int | None, any_size: bool) -> tuple[list[MicroBatch], float]:
    sizes = pool_sizes(pool, any_size)
    size_of = [smallest_size(n, capacity, sizes) for n in lengths]
    one = [cost.seconds((n,), d) for n, d in zip(lengths, size_of, strict=True)]
    free = [0.0] * pool
    assigned: dict[tuple[int, ...], list[int]] = {}
    order = sorted(range(len(lengths)), key=lambda i: (-size_of[i], -one[i], i))
    for size in sorted(set(size_of), reverse=True):
        groups = pool_groups(pool, size, rpn)
        base = {g: max(free[r] for r in g) for g in groups}
        load = dict.fromkeys(groups, 0.0)
        for i in (i for i in order if size_of[i] == size):
            g = min(groups, key=lambda g: (base[g] + load[g] + one[i], g))
            assigned.setdefault(g, []).append(i)
            load[g] += one[i]
        for g in groups:
            for r in g:
                free[r] = base[g] + load[g]
    micro = []
    for g in sorted(assigned, key=lambda g: (-len(g), g)):
        seqs = assigned[g]
        for b in _best_fit(seqs, lengths, len(g) * capacity):
            micro.append(MicroBatch(g, tuple(b), len(micro),
                                    cost.seconds([lengths[i] for i in b], len(g))))
    work = sum(o * d for o, d in zip(one, size_of, strict=True))
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
