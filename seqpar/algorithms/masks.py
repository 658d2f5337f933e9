"""Any attention mask (`seqpar.rules.masks`, the geometry without torch), for the algorithms:

    from seqpar.algorithms import masks
    m = masks.block_sparse(m_blk, block=64)          # or causal(n), sliding_window(n, w), ...
    attn = build_attention("ring", layout="balanced", group=g, mask=m)
    out = attn(q, k, v)                              # shards from layouts.shard(x, ..., mask=m)

Torch's FlexAttention describes a mask as a `mask_mod(b, h, q_idx, kv_idx) -> bool` and compiles it
into a `BlockMask` of (128 x 128)-token blocks for one kernel on one device; seqpar's mask is the
geometry itself (slices), which the distributed algorithms deal, route and count. `from_mask_mod`
takes a FlexAttention mask_mod (evaluated on the N x N grid, for small N) into a seqpar mask.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from seqpar.rules.masks import (
    DENSE_MAX,
    KINDS,
    SPECS,
    Mask,
    Slice,
    as_spec,
    block_sparse,
    causal,
    check_slices,
    default_spec,
    dilated,
    documents,
    from_config,
    from_dense,
    from_slices,
    full,
    parse,
    prefix_lm,
    random_block_sparse,
    shared_question,
    sliding_window,
)

__all__ = ["DENSE_MAX", "KINDS", "SPECS", "as_spec", "block_sparse", "causal", "check_slices",
           "default_spec", "dilated", "documents", "from_config", "from_dense", "from_mask_mod",
           "from_slices", "full", "Mask", "parse", "prefix_lm", "random_block_sparse",
           "shared_question", "Slice", "sliding_window"]


def from_mask_mod(mask_mod: Callable[..., torch.Tensor], n: int) -> Mask:
    """A mask from a FlexAttention-style `mask_mod(b, h, q_idx, kv_idx)` (batch and head 0),
    evaluated on the N x N grid of positions (N <= DENSE_MAX)."""
    q = torch.arange(n).view(n, 1)
    kv = torch.arange(n).view(1, n)
    zero = torch.zeros((), dtype=torch.long)
    dense = torch.as_tensor(mask_mod(zero, zero, q, kv)).expand(n, n)
    return from_dense(dense.cpu().numpy())
