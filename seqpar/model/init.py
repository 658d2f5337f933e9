"""Parameter values drawn shard by shard: each rank draws only the rows it holds.

Every matrix is N(0, INIT_STD²), every norm weight 1. A matrix's rows come in blocks of ROW_BLOCK
rows, and each block is drawn (float64, on the host) from a generator of its own, seeded by the
model's seed, the parameter's index and the block's index. So a row's value does not depend on
who draws it: a rank holding rows [a, b) of a parameter draws only the blocks those rows touch
(`draw_rows`), the one-process model draws them all, and both hold the same numbers — the float64
oracle tests need exactly that, at every world size and in every `states` mode. Nothing draws a
whole parameter unless it holds the whole parameter, and values reach the parameter's device and
dtype one block at a time: a model of any size starts on any number of ranks.

Under FSDP2 a parameter is a DTensor sharded on dim 0 as torch.chunk cuts it (`shard_rows`).
"""

from __future__ import annotations

import torch
from torch import nn

INIT_STD = 0.02
ROW_BLOCK = 256  # rows per seeded block: small enough that a shard boundary wastes little


def _block_seed(seed: int, index: int, block: int) -> int:
    return ((seed * 1_000_003 + index) * 1_000_033 + block) % (2**63 - 1)


def draw_rows(seed: int, index: int, shape: tuple[int, ...], start: int, stop: int) -> torch.Tensor:
    """Rows [start, stop) of parameter number `index` (full shape `shape`), float64 on the host:
    N(0, INIT_STD²), the same values whoever draws them."""
    rest = shape[1:]
    out = torch.empty((stop - start, *rest), dtype=torch.float64)
    for block in range(start // ROW_BLOCK, -(-stop // ROW_BLOCK)):
        b0 = block * ROW_BLOCK
        rows = min(ROW_BLOCK, shape[0] - b0)
        gen = torch.Generator().manual_seed(_block_seed(seed, index, block))
        values = torch.randn((rows, *rest), generator=gen, dtype=torch.float64).mul_(INIT_STD)
        lo, hi = max(start, b0), min(stop, b0 + rows)
        out[lo - start:hi - start] = values[lo - b0:hi - b0]
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


@torch.no_grad()
def init_parameters(net: nn.Module, seed: int) -> None:
    """Fill every parameter of `net` (in `named_parameters` order: a parameter's index is its
    place there): norm weights 1, matrices drawn by `draw_rows` for this rank's rows only."""
    for index, p in enumerate(net.parameters()):
        local = p.to_local() if hasattr(p, "to_local") else p
        if p.dim() == 1:
            local.fill_(1.0)
            continue
        start, stop = shard_rows(p)
        r0 = start
        while r0 < stop:  # a block at a time: host memory of one block, whatever the parameter
            r1 = min(stop, (r0 // ROW_BLOCK + 1) * ROW_BLOCK)
            local[r0 - start:r1 - start].copy_(draw_rows(seed, index, tuple(p.shape), r0, r1))
            r0 = r1
