"""Attention kernel time for one block of queries against one block of keys.

The block's kernel calls come from `layouts.block_tasks` (the one place the causal block relations
live) on a small proxy of the sequence (PROXY tokens per layout chunk), scaled to the real size: so
causal imbalance per layout (contiguous vs zigzag vs stripe) and the kernel's size per call follow
from the layout itself. FLOPs per call are `rules.flops.attention_flops`; a call of t query tokens runs
at rate * t / (t + kernel_half_tokens) (small blocks run slower, FlashAttention-2 Fig. 5), or at
the rate a calibrated host measured for its mask and size (`Cluster.call_rate`), at the head dim
the host measured it, scaled to the call's head dim by the host's measured time by head dim
(`dim_rate`), plus the cluster's fixed cost per call (a CPU's dispatch). Rates are one core's (one
device's): how
ranks share a host's cores is the caller's (`Cluster.host_seconds`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from itertools import chain

import numpy as np

from seqpar.planner.clusters import Cluster
from seqpar.rules import blocks, layouts, masks
from seqpar.rules.algorithms import call_relation
from seqpar.rules.flops import attention_flops
from seqpar.rules.relation import Relation

PROXY = 4  # proxy tokens per layout chunk (>= 2 so diagonal runs are seen)


@lru_cache(maxsize=64)
def _proxies(layout: str, world: int) -> list[tuple[int, ...] | None]:
    """Each rank's proxy positions, asked of the layout when first needed (a plan unites them
    in thousands of ways)."""
    return [None] * world


def _proxy(layout: str, world: int, rank: int) -> tuple[int, ...]:
    held = _proxies(layout, world)
    got = held[rank]
    if got is None:
        n = layouts.chunk_count(layout, world) * PROXY
        got = held[rank] = layouts.positions(layout, rank, world, n)
    return got


@lru_cache(maxsize=8192)
def proxy_positions(layout: str, world: int, members: tuple[int, ...]) -> tuple[int, ...]:
    """Sorted proxy positions of the union of `members`' shards."""
    return tuple(sorted(chain.from_iterable(_proxy(layout, world, r) for r in members)))


@lru_cache(maxsize=1024)
def same_deal(a: str, b: str, world: int) -> bool:
    """Whether layouts a and b deal every one of `world` ranks the same stretches of the sequence
    (the balanced layout keeps the mirrored deal where that is as balanced: zigzag's under a plain
    causal or full relation). Without a mask a prediction sees a layout only through its deal
    (`block_calls`), so two such layouts predict alike. Each layout's proxy tokens' ranks,
    stretched to a common length: the same ranks token by token."""
    if a == b:
        return True
    na, nb = (layouts.chunk_count(x, world) * PROXY for x in (a, b))
    scale = math.lcm(na, nb)
    return bool(np.array_equal(np.repeat(layouts.owners(a, world, na), scale // na),
                               np.repeat(layouts.owners(b, world, nb), scale // nb)))


@lru_cache(maxsize=65536)
def block_calls(layout: str, world: int, q_members: tuple[int, ...], k_members: tuple[int, ...],
                causal: bool) -> tuple[tuple[float, float, str], ...]:
    """Kernel calls (query fraction of the sequence, key fraction, mask) for the queries held by
    q_members against the keys held by k_members."""
    n = layouts.chunk_count(layout, world) * PROXY
    q = np.asarray(proxy_positions(layout, world, q_members))
    k = np.asarray(proxy_positions(layout, world, k_members))
    return tuple(((t.q1 - t.q0) / n, (t.k1 - t.k0) / n, t.mask)
                 for t in blocks.block_tasks(q, k, causal))


# a mask of more slices than this, over the stripe layout, is costed per slice, not per call (every
# slice meets every rank pair there, and each holds 1/P of its rows and keys)
STRIPE_SLICES = 64


@lru_cache(maxsize=65536)
def mask_calls(layout: str, world: int, q_members: tuple[int, ...],
               k_members: tuple[int, ...], mask: masks.Mask) -> tuple[tuple[float, float, str], ...]:
    """Kernel calls (query fraction, key fraction, mask) of any mask at its own length N, from the
    dispatch itself: the positions the layout deals under the mask and the calls the block planner
    makes of them (a band as a full call of its mean width: the same pairs). Over the stripe layout
    a mask of many slices is costed per slice, each rank pair 1/P^2 of its pairs."""
    n = mask.n
    rel = call_relation(layout, world, n, mask=mask)
    if layout == "stripe" and len(mask.slices) > STRIPE_SLICES:
        return tuple(((s.q1 - s.q0) / world / n, s.area / (s.q1 - s.q0) / world / n, "full")
                     for s in mask.slices)

    def held(members: tuple[int, ...]) -> np.ndarray:
        return np.sort(np.concatenate([np.asarray(blocks.rank_positions(layout, r, world, n, rel))
                                       for r in members]))

    q, k = held(q_members), held(k_members)
    if isinstance(rel, Relation) and rel.window is not None and not _within(q, k, rel):
        return ()  # a window no query of the block reaches across: no call
    out = []
    for t in blocks.block_tasks(q, k, rel):
        rows = t.q1 - t.q0
        if t.mask in ("full", "causal"):
            out.append((rows / n, (t.k1 - t.k0) / n, t.mask))
        else:  # shifted or band: a full call of the same pairs
            out.append((rows / n, t.pairs / rows / n, "full"))
    return tuple(out)


def _within(q: np.ndarray, k: np.ndarray, rel: Relation) -> bool:
    """Whether some key of sorted positions k lies in some query's window (q - W, q] (causal),
    or (q - W, q + W) (full): a bound on what the relation shows (documents only narrow it)."""
    w = rel.window
    upper = q + (0 if rel.causal else w - 1)
    return bool((np.searchsorted(k, upper, "right") - np.searchsorted(k, q - w, "right")).any())


@dataclass(frozen=True)
class Block:
    """One rank's kernel calls for a block of queries against a block of keys."""

    seconds: float  # forward kernel time on one core (or device), the calls' fixed cost included
    flops: float
    calls: int
    q_rows: float   # query rows summed over the calls: the partial outputs merged (forward)
    q_len: float    # the block's query rows: dq accumulated (backward)
    k_len: float    # the block's key rows: dk, dv accumulated (backward)


def dim_rate(cluster: Cluster, head_dim: float) -> float:
    """The kernel's rate at `head_dim` over its rate at the head dim its block table was measured
    at (`Cluster.attention_time_by_dim`, 1.0 there): (dim / that dim) / (time / its time), the time
    interpolated linearly in the dim and beyond the table in proportion to it; 1.0 without one."""
    table = cluster.attention_time_by_dim
    if not table:
        return 1.0
    points = sorted(table.items())
    base = next(d for d, t in points if t == 1.0) if 1.0 in table.values() else points[0][0]
    if head_dim <= points[0][0]:
        d, t = points[0]
        time = t * head_dim / d
    elif head_dim >= points[-1][0]:
        d, t = points[-1]
        time = t * head_dim / d
    else:
        (d0, t0), (d1, t1) = next(((a, b) for a, b in zip(points, points[1:], strict=False)
                                   if a[0] <= head_dim <= b[0]))
        time = t0 + (head_dim - d0) / (d1 - d0) * (t1 - t0)
    return (head_dim / base) / (time / table[base])


def block_seconds(cluster: Cluster, dtype: str, batch: int, seq_len: int, heads: int,
                  head_dim: float, calls: tuple[tuple[float, float, str], ...],
                  q_len: float = 0.0, k_len: float = 0.0) -> Block:
    """The forward kernel calls on one core of the cluster (one device), for a block of q_len
    query and k_len key tokens."""
    seconds = flops = q_rows = 0.0
    at_dim = dim_rate(cluster, head_dim)
    for fq, fk, mask in calls:
        sq, sk = fq * seq_len, fk * seq_len
        f = attention_flops(batch, 1, 1, heads, head_dim, mask) * sq * sk
        seconds += f / (cluster.call_rate(dtype, sq, mask) * at_dim) + cluster.kernel_call_us * 1e-6
        flops += f
        q_rows += sq
    return Block(seconds, flops, len(calls), q_rows, q_len, k_len)
