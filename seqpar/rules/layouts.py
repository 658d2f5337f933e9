"""How a sequence of N tokens is dealt to P ranks: the position maths of every layout, no torch.

- contiguous: rank r holds tokens [r*N//P, (r+1)*N//P).
- zigzag: the sequence is cut into 2P chunks; rank r holds chunks r and 2P-1-r (balanced causal work).
  With documents (cu_seqlens) *each document* is dealt so, its last L mod 2P tokens (its tail) round
  robin over the ranks, the rotation running on across documents.
- stripe: token t goes to rank t mod P (BurstEngine Eq. 14; with a block mask whose block size is a
  multiple of P, BurstEngine's block-wise striped balance, §3.4).
- balanced: C = P*m equal chunks (m the largest of 8, 4, 2, 1 with a chunk of a token at least; the
  last N mod C tokens round robin) dealt to minimise the largest rank's visible (query, key) pairs
  under the call's mask (`assign`: greedy largest-first, then pairwise swaps; `best_deal` keeps a
  contiguous or mirrored deal where that is as balanced). `Balance.gap` bounds the distance from
  the optimum (docs/masks.md: Balance).

Every rank's positions come out sorted. `positions` returns them as a tuple (cached); the torch layer
(`seqpar.algorithms.layouts`) turns them into tensors. Any length N with cu_seqlens: every rank
holds floor(N/P) or ceil(N/P) tokens and shards are padded to s = ceil(N/P) rows at their end
(padding rows hold positions N + r*s + j: no query sees them, they see nothing).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from seqpar.errors import require

LAYOUTS = ("contiguous", "zigzag", "stripe", "balanced")
BALANCED_CHUNKS = (8, 4, 2, 1)  # chunks a rank in the balanced layout: the largest that divides N/P


def chunk_count(layout: str, world: int) -> int:
    """How many equal pieces the classic deal cuts a sequence into (a length that does not divide
    into them deals its last N mod pieces tokens round robin). Balanced: the fewest it may use."""
    check_layout(layout)
    return 2 * world if layout == "zigzag" else world


def check_layout(layout: str) -> None:
    require(layout in LAYOUTS, "layout", layout, f"must be one of {', '.join(LAYOUTS)}")


def check_seq_len(layout: str, world: int, seq_len: int,
                  cu: tuple[int, ...] | None = None) -> None:
    """Any N > 0 with cu_seqlens; without them N must split evenly over the ranks (every rank then
    holds N/P tokens and knows N from its own shard), in every layout. The balanced layout deals
    equal chunks and its tail (N mod chunks) round robin, like zigzag."""
    check_layout(layout)
    if cu is not None:
        require(seq_len > 0, "seq_len", seq_len, "must be positive")
        return
    require(seq_len > 0 and seq_len % world == 0, "seq_len", seq_len,
            f"must be a positive multiple of world={world} without cu_seqlens (ranks of uneven "
            f"shards cannot tell N; any length with cu_seqlens=[0, N])")


def shard_len(seq_len: int, world: int) -> int:
    """Rows of every rank's (padded) shard: ceil(N / P)."""
    return -(-seq_len // world)


def as_cu(cu_seqlens: Any) -> tuple[int, ...] | None:
    """cu_seqlens (any sequence of ints, an array or a tensor, or None) as a hashable tuple."""
    if cu_seqlens is None:
        return None
    values = cu_seqlens.tolist() if hasattr(cu_seqlens, "tolist") else cu_seqlens
    return tuple(int(x) for x in values)


def normal_cu(layout: str, world: int, seq_len: int, cu_seqlens: Any) -> tuple[int, ...] | None:
    """cu_seqlens as the relation keeps them: None for one document of a length that splits evenly
    over the ranks (a plain call: the deal is the same), else a tuple."""
    cu = as_cu(cu_seqlens)
    if cu is not None and len(cu) == 2 and cu[0] == 0 and cu[1] == seq_len \
            and seq_len % world == 0:
        return None
    return cu


def call_cu(world: int, seq_len: int, cu: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """The documents a call on N tokens runs with: cu as given; without them, none when N splits
    over the ranks (a plain call), else one document [0, N] (uneven shards carry N)."""
    if cu:
        return cu
    return None if seq_len % world == 0 else (0, seq_len)


def check_documents(layout: str, world: int, seq_len: int, cu: tuple[int, ...] | None) -> None:
    """cu_seqlens must run 0 < ... < N strictly increasing (N: the real length, at most the padded
    seq_len of the algorithm's shards)."""
    if cu is None:
        return
    require(len(cu) >= 2 and cu[0] == 0 and 0 < cu[-1] <= seq_len
            and all(b > a for a, b in zip(cu, cu[1:], strict=False)), "cu_seqlens", list(cu),
            f"must increase strictly from 0 to seq_len={seq_len}")


def positions(layout: str, rank: int, world: int, seq_len: int, cu: tuple[int, ...] | None = None,
              mask: Any = None) -> tuple[int, ...]:
    """Token positions (sorted) held by `rank`. cu: the global document boundaries (None: one
    document); with them seq_len may exceed N = cu[-1] (the padded length): padding positions
    follow. mask: the call's mask or relation, which only the balanced layout's deal depends on
    (None: causal)."""
    return _positions(layout, rank, world, seq_len, cu, mask if layout == "balanced" else None)


@lru_cache(maxsize=4096)
def _positions(layout: str, rank: int, world: int, seq_len: int, cu: tuple[int, ...] | None,
               mask: Any) -> tuple[int, ...]:
    check_seq_len(layout, world, seq_len, cu)
    check_documents(layout, world, seq_len, cu)
    require(0 <= rank < world, "rank", rank, f"must be in [0, {world})")
    n = cu[-1] if cu is not None else seq_len
    if layout == "balanced":
        real = balanced_deal(world, n, mask).ranks[rank]
    else:
        real = _dealt(layout, rank, world, n, cu if cu is not None else (0, n))
    if seq_len == n:
        return real
    s = seq_len // world  # padded shard: positions N + rank*s + j after the real ones
    return real + tuple(n + rank * s + j for j in range(s - len(real)))


def _dealt(layout: str, rank: int, world: int, n: int, cu: tuple[int, ...]) -> tuple[int, ...]:
    """The real tokens of `rank` in a classic layout (see the module docstring), sorted."""
    if layout == "contiguous":
        return tuple(range(rank * n // world, (rank + 1) * n // world))
    if layout == "stripe":
        return tuple(range(rank, n, world))
    out: list[int] = []
    turn = 0  # the tail rotation, running on across documents
    for a, b in zip(cu, cu[1:], strict=False):
        c, tail = divmod(b - a, 2 * world)
        first, second = rank, 2 * world - 1 - rank
        out += range(a + first * c, a + (first + 1) * c)
        out += range(a + second * c, a + (second + 1) * c)
        start = a + 2 * world * c
        out += [start + j for j in range(tail) if (turn + j) % world == rank]
        turn = (turn + tail) % world
    return tuple(out)



def owners(layout: str, world: int, n: int) -> np.ndarray:
    """The rank holding each of n tokens of one document (the balanced layout's causal deal): what
    `positions` deals rank by rank, for every rank at once."""
    check_layout(layout)
    if layout == "stripe":
        return np.arange(n) % world
    if layout == "contiguous":
        return np.repeat(np.arange(world), np.diff([r * n // world for r in range(world + 1)]))
    if layout == "zigzag":
        c, tail = divmod(n, 2 * world)
        chunk = np.arange(2 * world * c) // c if c else np.arange(0)
        return np.concatenate([np.where(chunk < world, chunk, 2 * world - 1 - chunk),
                               np.arange(tail) % world])
    out = np.empty(n, dtype=np.int64)
    for r, held in enumerate(balanced_deal(world, n, None).ranks):
        out[list(held)] = r
    return out

# ------------------------------------------------------------------------------ the balanced deal
@dataclass(frozen=True)
class Balance:
    """A balanced deal: `ranks[r]` the sorted positions of rank r, `chunk` the chunk length,
    `loads[r]` the visible pairs of rank r's queries, `bound` a lower bound on the optimum's largest
    load (the solver's max is within max/bound of the optimum)."""

    ranks: tuple[tuple[int, ...], ...]
    chunk: int
    loads: tuple[int, ...]
    bound: float

    @property
    def imbalance(self) -> float:
        """max / mean visible pairs over ranks (1.0: perfectly balanced)."""
        mean = sum(self.loads) / len(self.loads)
        return max(self.loads) / mean if mean else 1.0

    @property
    def gap(self) -> float:
        """The largest load over the lower bound: how far from the optimum it can be at most."""
        return max(self.loads) / self.bound if self.bound else 1.0


def balanced_chunks(world: int, n: int) -> int:
    """Chunks a rank holds in the balanced layout: the largest of BALANCED_CHUNKS that leaves every
    chunk a token at least."""
    return next((m for m in BALANCED_CHUNKS if n >= world * m), 1)


@lru_cache(maxsize=256)
def balanced_deal(world: int, n: int, mask: Any = None) -> Balance:
    """Deal P*m equal chunks of [0, n) to `world` ranks, m each, minimising the largest rank's
    visible pairs under `mask` (anything with `row_counts(n)`: visible keys per query row; None:
    causal)."""
    m = balanced_chunks(world, n)
    chunk = n // (world * m)
    body = world * m * chunk  # the last n - body tokens go round robin
    rows = _row_counts(mask, n)
    loads = rows[:body].reshape(world * m, chunk).sum(axis=1).tolist()
    owner = best_deal(loads, world, m)
    held: list[list[int]] = [[] for _ in range(world)]
    for c, r in enumerate(owner):  # chunk order: each rank's chunks ascending
        held[r].append(c)
    ranks = tuple(tuple([t for c in held[r] for t in range(c * chunk, (c + 1) * chunk)]
                        + list(range(body + r, n, world))) for r in range(world))
    per_rank = tuple(int(rows[list(p)].sum()) for p in ranks)
    return Balance(ranks, chunk, per_rank, load_bound(loads, world, m))


def _row_counts(mask: Any, n: int) -> np.ndarray:
    if mask is None:
        return np.arange(1, n + 1, dtype=np.int64)
    return np.asarray(mask.row_counts(n), dtype=np.int64)


# a classic deal within this much of the solver's largest load is taken instead: the same balance,
# fewer runs (fewer kernel calls, and K,V blocks that fewer ranks need)
CLASSIC_SLACK = 1.005


def best_deal(loads: list[int], world: int, per_rank: int) -> list[int]:
    """owner[i] of each chunk: the contiguous deal, the mirrored one (zigzag in chunks) or the
    solver's (`assign`), whichever has the smallest largest load, a classic one where it is within
    CLASSIC_SLACK of the solver's."""
    c = len(loads)
    half = max(per_rank // 2, 1)
    contiguous = [i // per_rank for i in range(c)]
    mirrored = ([min(i, c - 1 - i) // half for i in range(c)] if per_rank % 2 == 0
                else contiguous)
    solved = assign(loads, world, per_rank)

    def largest(owner: list[int]) -> int:
        total = [0] * world
        for x, o in zip(loads, owner, strict=True):
            total[o] += x
        return max(total)

    best = largest(solved)
    for classic in (contiguous, mirrored):
        if largest(classic) <= best * CLASSIC_SLACK:
            return classic
    return solved


def assign(loads: list[int], world: int, per_rank: int) -> list[int]:
    """owner[i] of each chunk: every rank takes exactly `per_rank` chunks, the largest load as small
    as a greedy largest-first pass (each chunk to the lightest rank with room) followed by pairwise
    swaps between the heaviest rank and any other can make it."""
    order = sorted(range(len(loads)), key=lambda i: (-loads[i], i))
    total = [0] * world
    held: list[list[int]] = [[] for _ in range(world)]
    room = [(0, r) for r in range(world)]  # (load, rank) of the ranks with room: the lightest first
    for i in order:
        _, r = heapq.heappop(room)
        held[r].append(i)
        total[r] += loads[i]
        if len(held[r]) < per_rank:
            heapq.heappush(room, (total[r], r))
    improved = True
    while improved:
        improved = False
        hi = max(range(world), key=lambda r: (total[r], -r))
        for lo in sorted(range(world), key=lambda r: total[r]):
            if lo == hi:
                continue
            best = None
            for a in held[hi]:
                for b in held[lo]:
                    delta = loads[a] - loads[b]
                    # the swap lowers the heavy rank and keeps the light one below the old max
                    if 0 < delta and total[lo] + delta < total[hi] and (
                            best is None or delta > best[0]):
                        best = (delta, a, b)
            if best is not None:
                delta, a, b = best
                held[hi][held[hi].index(a)], held[lo][held[lo].index(b)] = b, a
                total[hi] -= delta
                total[lo] += delta
                improved = True
                break
    owner = [0] * len(loads)
    for r, chunks in enumerate(held):
        for i in chunks:
            owner[i] = r
    return owner


def load_bound(loads: list[int], world: int, per_rank: int) -> float:
    """A lower bound on the largest rank load of any deal of these chunks, `per_rank` a rank: the
    mean load, and the heaviest chunk plus the per_rank - 1 lightest others (the rank that holds
    the heaviest chunk holds at least that)."""
    mean = sum(loads) / world
    ordered = sorted(loads)
    heaviest = ordered[-1] + sum(ordered[:per_rank - 1]) if ordered else 0
    return float(max(mean, heaviest))
