"""How a sequence of N tokens is dealt to P ranks, and which (query, key) blocks a causal mask keeps.

- contiguous: rank r holds tokens [r*s, (r+1)*s) with s = N/P.
- zigzag: the sequence is cut into 2P chunks; rank r holds chunks r and 2P-1-r (balanced causal work).
- stripe: token t goes to rank t mod P (balanced; BurstEngine Eq. 14).

Every rank's token positions come out sorted, so a causal mask between a query block and a key
block is a *prefix* mask: query row a sees the first `count[a]` keys. `block_tasks` turns any such
pair of position lists into a few kernel calls with the masks the kernels know (full, causal,
shifted). This is the one place the causal block relations live; algorithms never special-case a
layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from seqpar.errors import require

LAYOUTS = ("contiguous", "zigzag", "stripe")


def chunk_count(layout: str, world: int) -> int:
    """How many equal pieces the sequence is cut into; seq_len must be a multiple of it."""
    check_layout(layout)
    return 2 * world if layout == "zigzag" else world


def check_layout(layout: str) -> None:
    require(layout in LAYOUTS, "layout", layout, f"must be one of {', '.join(LAYOUTS)}")


def check_seq_len(layout: str, world: int, seq_len: int) -> None:
    """seq_len must split evenly into the layout's pieces."""
    n = chunk_count(layout, world)
    require(seq_len > 0 and seq_len % n == 0, "seq_len", seq_len,
            f"must be a positive multiple of {n} ({layout} layout over {world} ranks)")


@lru_cache(maxsize=4096)
def _positions(layout: str, rank: int, world: int, seq_len: int) -> tuple[int, ...]:
    check_seq_len(layout, world, seq_len)
    require(0 <= rank < world, "rank", rank, f"must be in [0, {world})")
    if layout == "contiguous":
        s = seq_len // world
        return tuple(range(rank * s, (rank + 1) * s))
    if layout == "zigzag":
        c = seq_len // (2 * world)
        first, second = rank, 2 * world - 1 - rank
        return tuple(range(first * c, (first + 1) * c)) + tuple(range(second * c, (second + 1) * c))
    return tuple(range(rank, seq_len, world))


def positions(layout: str, rank: int, world: int, seq_len: int) -> torch.Tensor:
    """Token positions (sorted, int64) held by `rank`; RoPE and causal masks use these."""
    return torch.tensor(_positions(layout, rank, world, seq_len), dtype=torch.long)


def shard(x: torch.Tensor, layout: str, rank: int, world: int, dim: int = 1) -> torch.Tensor:
    """The part of the full-sequence tensor x that `rank` holds."""
    idx = positions(layout, rank, world, x.shape[dim]).to(x.device)
    return x.index_select(dim, idx)


def unshard(shards: list[torch.Tensor], layout: str, dim: int = 1) -> torch.Tensor:
    """Inverse of shard: reassemble the full sequence from every rank's shard (rank order)."""
    world = len(shards)
    seq_len = sum(t.shape[dim] for t in shards)
    stacked = torch.cat(shards, dim=dim)
    order = torch.cat([positions(layout, r, world, seq_len) for r in range(world)])
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(seq_len)
    return stacked.index_select(dim, inverse.to(stacked.device))


def sort_order(pos: torch.Tensor) -> torch.Tensor | None:
    """Permutation that sorts `pos`, or None when it is already sorted."""
    if pos.numel() < 2 or bool((pos[1:] > pos[:-1]).all()):
        return None
    return torch.argsort(pos)


# --------------------------------------------------------------------------------- block relations
@dataclass(frozen=True)
class Task:
    """One kernel call: queries [q0, q1) against keys [k0, k1) under `mask`."""

    q0: int
    q1: int
    k0: int
    k1: int
    mask: str


def block_tasks(q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool = True) -> tuple[Task, ...]:
    """Kernel calls that compute causal attention of queries at q_pos over keys at k_pos.

    k_pos must be sorted. Without `causal` the answer is one full block. Rows that see no key get
    no task (the caller leaves them at lse = -inf).
    """
    sq, sk = q_pos.numel(), k_pos.numel()
    if not causal:
        return (Task(0, sq, 0, sk, "full"),)
    counts = torch.searchsorted(k_pos.contiguous(), q_pos.contiguous(), right=True).tolist()
    tasks: list[Task] = []
    a0 = 0
    while a0 < sq:
        c0 = counts[a0]
        a1 = a0 + 1
        if a1 < sq and counts[a1] == c0 + 1:  # a diagonal run: row a sees keys [0, a + delta)
            while a1 < sq and counts[a1] == counts[a1 - 1] + 1:
                a1 += 1
            if c0 >= 1:
                if c0 > 1:
                    tasks.append(Task(a0, a1, 0, c0 - 1, "full"))
                tasks.append(Task(a0, a1, c0 - 1, c0 - 1 + (a1 - a0), "causal"))
            else:
                tasks.append(Task(a0, a1, 0, a1 - a0, "shifted"))
        else:  # a flat run: every row sees the same first c0 keys
            while a1 < sq and counts[a1] == c0:
                a1 += 1
            if c0 > 0:
                tasks.append(Task(a0, a1, 0, c0, "full"))
        a0 = a1
    return tuple(tasks)


@lru_cache(maxsize=4096)
def layout_tasks(layout: str, world: int, seq_len: int, q_rank: int, k_rank: int,
                 causal: bool) -> tuple[Task, ...]:
    """block_tasks for the shards of q_rank (queries) and k_rank (keys) in a layout, cached."""
    return block_tasks(positions(layout, q_rank, world, seq_len),
                       positions(layout, k_rank, world, seq_len), causal)
