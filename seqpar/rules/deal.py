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
- `dynamic`: each sequence on a group of the pool that holds it, placed so the slowest rank is as
  fast as it can make it (`rules.dynamic_deal`: the smallest group, or sizes by cost).

What a deal is, its global order and rounds: `rules.micro_batches`; what a micro-batch costs:
`rules.cost_model`; packing: `rules.packing`. The lower bound is max(the rank-seconds any packing
needs / pool, the longest single micro-batch a sequence needs); `gap` is the makespan over it, so
the optimum is at most that far away.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from seqpar.errors import require
from seqpar.rules.cost_model import CostModel
from seqpar.rules.dynamic_deal import dynamic, placed
from seqpar.rules.lengths import Distribution, draw_batches
from seqpar.rules.lengths import Sequence as Sequence_
from seqpar.rules.micro_batches import Deal, MicroBatch, in_rounds, rounds
from seqpar.rules.packing import balanced, best_fit, split_to_multiple
from seqpar.rules.pool import pool_groups, pool_sizes

# what callers take from here: the deal's own types live in `micro_batches` and `cost_model`
__all__ = ["DEGREES", "PACKINGS", "POLICIES", "Batch", "CostModel", "Deal", "MicroBatch",
           "check_lengths", "deal", "in_rounds", "plan_batches"]

POLICIES = ("static", "dynamic")
DEGREES = ("smallest", "cost")  # the dynamic policy's group sizes: Megatron-LM's rule, or by cost
PACKINGS = ("best-fit", "cost-balanced")


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
            micro, bound = placed(lengths, pool, capacity, cost, ranks_per_node, list(sizes))
        else:
            micro, bound = dynamic(lengths, pool, capacity, cost, ranks_per_node, any_size,
                                   degrees)
    if policy == "static":
        micro = rounds(micro, pool)
    free = Deal(policy, packing, pool, capacity, lengths, tuple(micro), False, bound)
    return in_rounds(free) if equal_counts else free


def _static(lengths: tuple[int, ...], pool: int, capacity: int, degree: int, packing: str,
            cost: CostModel, rpn: int | None) -> tuple[list[MicroBatch], float]:
    room = degree * capacity
    dp = pool // degree
    att, one, bins = _best_fit(lengths, degree, capacity, cost)
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


@lru_cache(maxsize=16)
def _best_fit(lengths: tuple[int, ...], degree: int, capacity: int, cost: CostModel
              ) -> tuple[tuple[float, ...], tuple[float, ...], tuple[tuple[int, ...], ...]]:
    """Each sequence's (attention seconds, seconds alone) on `degree` ranks and best-fit's packs,
    longest first (the first on a tie: a stable sort keeps ties in order, reversed or not):
    memoised, as a plan deals each batch best-fit and cost-balanced (which counts best-fit's
    packs) at every degree."""
    att, one = cost.each(lengths, [degree] * len(lengths))
    by_length = sorted(range(len(lengths)), key=lengths.__getitem__, reverse=True)
    bins = best_fit(by_length, lengths, degree * capacity)
    return tuple(att), tuple(one), tuple(tuple(b) for b in bins)


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
