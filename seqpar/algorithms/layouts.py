"""Layouts and block relations for torch: the rules' position maths (`seqpar.rules.layouts`) and
block planner (`seqpar.rules.blocks`) with tensors in and out.

    layouts.positions("zigzag", rank, world, n)            # int64 tensor, sorted
    layouts.shard(x, "balanced", rank, world, mask=m)      # the part of x rank holds
    layouts.unshard(shards, "balanced", mask=m)            # and back

Every function takes the call's documents (`cu_seqlens`) and its `mask` (a `masks.Mask`); only the
balanced layout's deal depends on the mask, and zigzag's on the documents (a mask made by
`masks.documents` carries them). See the rules modules for the layouts, the relations and the
planner; nothing here decides anything they do not.
"""

from __future__ import annotations

from typing import Any

import torch

from seqpar.rules import blocks as _blocks
from seqpar.rules import layouts as _layouts
from seqpar.rules.blocks import Task, layout_need, layout_tasks, rank_pairs
from seqpar.rules.layouts import (
    LAYOUTS,
    balanced_chunks,
    call_cu,
    check_documents,
    check_layout,
    check_seq_len,
    chunk_count,
    normal_cu,
    shard_len,
)
from seqpar.rules.layouts import as_cu as _as_cu
from seqpar.rules.masks import Mask
from seqpar.rules.relation import Relation, as_relation

__all__ = ["LAYOUTS", "Mask", "Relation", "Task", "as_cu", "as_relation", "balanced_chunks",
           "block_tasks",
           "call_cu", "check_documents", "check_layout", "check_seq_len", "chunk_count",
           "layout_need", "layout_tasks", "normal_cu", "positions", "rank_pairs", "sees", "shard",
           "shard_len", "sort_order", "unshard"]


def as_cu(cu_seqlens: Any) -> tuple[int, ...] | None:
    """cu_seqlens (tensor, sequence or None) as a hashable tuple (or None)."""
    return _as_cu(cu_seqlens)


def _deal(layout: str, world: int, seq_len: int, cu_seqlens: Any, mask: Mask | None
          ) -> tuple[tuple[int, ...] | None, Mask | None]:
    """The (documents, mask) a deal of seq_len tokens depends on: the mask's own documents when
    the call gives none."""
    cu = as_cu(cu_seqlens)
    if cu is None and mask is not None:  # uneven shards of a mask carry N as one document
        cu = call_cu(world, seq_len, mask.cu)
    return normal_cu(layout, world, seq_len, cu), mask


def positions(layout: str, rank: int, world: int, seq_len: int, cu_seqlens: Any = None,
              mask: Mask | None = None) -> torch.Tensor:
    """Token positions (sorted, int64) held by `rank`, in its local order; RoPE, labels and the
    masks use these. cu_seqlens: the global document boundaries; with them, seq_len may exceed
    N = cu_seqlens[-1] (the padded length): padding positions follow. mask: the call's mask (the
    balanced layout deals by it)."""
    cu, mask = _deal(layout, world, seq_len, cu_seqlens, mask)
    from_rules = _layouts.positions(layout, rank, world, seq_len, cu, mask)
    return torch.tensor(from_rules, dtype=torch.long)


def shard(x: torch.Tensor, layout: str, rank: int, world: int, dim: int = 1,
          cu_seqlens: Any = None, mask: Mask | None = None) -> torch.Tensor:
    """The part of the full-sequence tensor x that `rank` holds."""
    idx = positions(layout, rank, world, x.shape[dim], cu_seqlens, mask).to(x.device)
    return x.index_select(dim, idx)


def unshard(shards: list[torch.Tensor], layout: str, dim: int = 1, cu_seqlens: Any = None,
            mask: Mask | None = None) -> torch.Tensor:
    """Inverse of shard: reassemble the full sequence from every rank's shard (rank order)."""
    world = len(shards)
    seq_len = sum(t.shape[dim] for t in shards)
    stacked = torch.cat(shards, dim=dim)
    order = torch.cat([positions(layout, r, world, seq_len, cu_seqlens, mask)
                       for r in range(world)])
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(seq_len)
    return stacked.index_select(dim, inverse.to(stacked.device))


def sort_order(pos: torch.Tensor) -> torch.Tensor | None:
    """Permutation that sorts `pos`, or None when it is already sorted."""
    if pos.numel() < 2 or bool((pos[1:] > pos[:-1]).all()):
        return None
    return torch.argsort(pos)


def block_tasks(q_pos: Any, k_pos: Any, causal: Relation | Mask | bool = True
                ) -> tuple[Task, ...]:
    """`rules.blocks.block_tasks` on tensors or sequences of positions (k_pos sorted)."""
    return _blocks.block_tasks(_numpy(q_pos), _numpy(k_pos), causal)


def sees(q_pos: Any, k_pos: Any, causal: Relation | Mask | bool = True) -> bool:
    """`rules.blocks.sees` on tensors or sequences of positions."""
    return _blocks.sees(_numpy(q_pos), _numpy(k_pos), causal)


def _numpy(pos: Any) -> Any:
    return pos.cpu().numpy() if isinstance(pos, torch.Tensor) else pos
