"""Parameter values drawn shard by shard: each rank draws only the rows it holds.

Every matrix is N(0, INIT_STD²), every norm weight 1 (0 where a family scales by 1 + w), every bias
and sink 0. A matrix's rows come in blocks of ROW_BLOCK rows, and each block is drawn (float32 on
the host: 2.6x faster than float64 draws, and exact in a float64 model) from a generator of its
own, seeded by the model's seed, the parameter's index and the block's index. So a row's value does
not depend on who draws it: a rank holding rows [a, b) of a parameter draws only the blocks those
rows touch (`draw_rows`), the one-process model draws them all, and both hold the same numbers —
the float64 oracle tests need exactly that, at every world size and in every `states` mode.
Nothing draws a whole parameter unless it holds the whole parameter, and values reach the
parameter's device and dtype one block at a time: a model of any size starts on any number of
ranks.

Under FSDP2 a parameter is a DTensor sharded on dim 0 as torch.chunk cuts it (`shard_rows`).
"""

from __future__ import annotations

import math

import torch
from torch import nn

INIT_STD = 0.02
NORMS = frozenset({"attn_norm", "ffn_norm", "post_attn_norm", "post_ffn_norm", "q_norm", "k_norm",
                   "norm", "q_a_norm", "kv_a_norm"})
ZEROS = frozenset({"bq", "bk", "bv", "bo", "b1", "b3", "b2", "sinks", "router_bias",
                   "experts_b1", "experts_b3", "experts_b2",
                   "router_score_bias"})  # biases and sinks
ONES = frozenset({"lin_norm", "lin_dt_bias"})  # a gated DeltaNet's gated norm (w, not 1 + w), dt bias
ROW_BLOCK = 256  # rows per seeded block: small enough that a shard boundary wastes little


def _block_seed(seed: int, index: int, block: int) -> int:
    return ((seed * 1_000_003 + index) * 1_000_033 + block) % (2**63 - 1)


def _block(seed: int, index: int, shape: tuple[int, ...], block: int) -> torch.Tensor:
    """Block `block` (rows [block * ROW_BLOCK, ...)) of parameter number `index`, float32."""
    rows = min(ROW_BLOCK, shape[0] - block * ROW_BLOCK)
    gen = torch.Generator().manual_seed(_block_seed(seed, index, block))
    return torch.randn((rows, *shape[1:]), generator=gen, dtype=torch.float32).mul_(INIT_STD)


def _pieces(start: int, stop: int):
    """(block, rows [lo, hi) of it) for the blocks rows [start, stop) touch."""
    for block in range(start // ROW_BLOCK, -(-stop // ROW_BLOCK)):
        b0 = block * ROW_BLOCK
        yield block, max(start, b0), min(stop, b0 + ROW_BLOCK)


def draw_rows(seed: int, index: int, shape: tuple[int, ...], start: int, stop: int) -> torch.Tensor:
    """Rows [start, stop) of parameter number `index` (full shape `shape`), float32 on the host:
    N(0, INIT_STD²), the same values whoever draws them."""
    out = torch.empty((stop - start, *shape[1:]), dtype=torch.float32)
    for block, lo, hi in _pieces(start, stop):
        b0 = block * ROW_BLOCK
        out[lo - start:hi - start] = _block(seed, index, shape, block)[lo - b0:hi - b0]
    return out


def shard_rows(p: torch.Tensor) -> tuple[int, int]:
    """The rows [start, stop) of the full parameter that this rank's local tensor holds."""
    if not (hasattr(p, "to_local") and hasattr(p, "device_mesh")):
        return 0, p.shape[0]
    mesh, placements = p.device_mesh, p.placements
    if len(placements) != 1 or not (placements[0].is_shard() and placements[0].dim == 0):
        raise ValueError(f"init: a parameter sharded as {placements} (seqpar shards on dim 0)")
    n, world, rank = p.shape[0], mesh.size(), mesh.get_local_rank()
    chunk = -(-n // world)  # torch.chunk: ceil-sized pieces, the last ones short or empty
    start, stop = min(n, rank * chunk), min(n, (rank + 1) * chunk)
    local = p.to_local()
    if local.shape[0] != stop - start:
        raise ValueError(f"init: a local shard of {local.shape[0]} rows where torch.chunk gives "
                         f"{stop - start} (rows {start}..{stop} of {n})")
    return start, stop


def fill_value(name: str, norm_offset: bool) -> float | None:
    """What parameter `name` starts as where it is not drawn: a norm weight 1 (0 where the family
    stores w and scales by 1 + w: Gemma), a bias or sink 0; None: drawn."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf in NORMS:
        return 0.0 if norm_offset else 1.0
    if leaf in ONES:
        return 1.0
    return 0.0 if leaf in ZEROS else None


@torch.no_grad()
def init_parameters(net: nn.Module, seed: int, norm_offset: bool = False) -> None:
    """Fill every parameter of `net` (in `named_parameters` order: a parameter's index is its
    place there): norms and biases by `fill_value`, matrices drawn by `draw_rows` for this rank's
    rows only. A stacked parameter (experts: (E, f, d)) is drawn as the matrix of its rows
    (E * f, d), so a block stays ROW_BLOCK rows of one matrix however large an expert."""
    for index, (name, p) in enumerate(net.named_parameters()):
        local = p.to_local() if hasattr(p, "to_local") else p
        value = fill_value(name, norm_offset)
        if value is not None:
            local.fill_(value)
            continue
        start, stop = shard_rows(p)
        per = math.prod(p.shape[1:-1])  # matrix rows one slice of a stacked parameter holds
        flat = local.view(-1, p.shape[-1]) if p.dim() > 2 else local
        shape = (p.shape[0] * per, *p.shape[-1:]) if p.dim() > 2 else tuple(p.shape)
        start, stop = start * per, stop * per
        for block, lo, hi in _pieces(start, stop):  # host memory of one block, whatever the size
            b0 = block * ROW_BLOCK
            values = _block(seed, index, shape, block)
            flat[lo - start:hi - start].copy_(values[lo - b0:hi - b0])
