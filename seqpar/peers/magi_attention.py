"""`peer:magi-attention`: SandAI's MagiAttention (its dispatch solver, group-cast / group-reduce
collectives and flex-flash-attention kernels; package `magi_attention`): CUDA (Hopper) only.

MagiAttention deals the sequence itself: `magi_attn_varlen_key` plans a load-balanced dispatch of
the global (total tokens, heads, dim) tensor, `dispatch` takes this rank's chunks, `calc_attn` runs
the distributed attention and `undispatch` gathers the global output. seqpar's shards therefore
convert both ways (`to_packed`, `from_packed`): the adapter all-gathers the unsharded q, k, v
(differentiably), packs the batch rows as documents [0, N, 2N, ...] of one varlen sequence, and
keeps its own layout shard of the global output. Those two conversions are timed with the peer but
not booked as its bytes (they go through `torch.distributed.nn`, which the hooks do not wrap).
No analytic byte count is modelled (the dispatch solver decides what travels); its rules:
`seqpar.rules.peers.MagiAttentionRules`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from seqpar.algorithms import layouts
from seqpar.peers.adapter import AutogradPeer
from seqpar.peers.booking import Hook, gather_sends, nbytes
from seqpar.rules.peers import MagiAttentionRules


def alltoallv_sends(comm: Any, output: torch.Tensor, input: torch.Tensor,
                    output_split_sizes: list[int] | None = None,
                    input_split_sizes: list[int] | None = None, *args: Any,
                    **kwargs: Any) -> dict[int, int]:
    """dist.all_to_all_single with (possibly unequal) splits along dim 0 (MagiAttention's
    group-cast and group-reduce)."""
    splits = kwargs.get("input_split_sizes", input_split_sizes)
    if splits is None:
        return {i: nbytes(input) // comm.size for i in range(comm.size) if i != comm.rank}
    row = nbytes(input) // max(1, input.shape[0])
    return {i: n * row for i, n in enumerate(splits) if i != comm.rank and n}


def to_packed(t: torch.Tensor) -> torch.Tensor:
    """(B, N, H, D) -> (B*N, H, D): batch rows as consecutive documents."""
    return t.reshape(t.shape[0] * t.shape[1], *t.shape[2:])


def from_packed(t: torch.Tensor, batch: int) -> torch.Tensor:
    return t.reshape(batch, t.shape[0] // batch, *t.shape[1:])


def row_bounds(batch: int, seq_len: int, device: torch.device) -> torch.Tensor:
    """cu_seqlens of B documents of N tokens: [0, N, 2N, ..., B*N] (int32)."""
    return torch.arange(0, (batch + 1) * seq_len, seq_len, dtype=torch.int32, device=device)


class MagiAttention(MagiAttentionRules, AutogradPeer):
    def unsharded(self, t: torch.Tensor) -> torch.Tensor:
        """The whole sequence from every rank's layout shard (differentiable all-gather)."""
        from torch.distributed.nn.functional import all_gather

        shards = all_gather(t.contiguous(), group=self.comm.group)
        return layouts.unshard(list(shards), self.layout)

    def run(self, q, k, v):
        from magi_attention.api import (
            calc_attn,
            compute_pad_size,
            dispatch,
            magi_attn_varlen_key,
            undispatch,
        )

        b, n = q.shape[0], q.shape[1] * self.world
        total = [to_packed(self.unsharded(t)) for t in (q, k, v)]
        cu = row_bounds(b, n, q.device)
        pad = compute_pad_size(b * n, self.world, q.shape[-1])
        pad = pad[0] if isinstance(pad, tuple) else pad
        padded_q, key = magi_attn_varlen_key(total[0], cu, cu, head_dim=q.shape[-1],
                                             pad_size=pad, cp_group=self.comm.group,
                                             causal=self.causal)
        local = [dispatch(padded_q, key)] + [dispatch(torch.nn.functional.pad(
            t, (0, 0, 0, 0, 0, pad)), key) for t in total[1:]]
        out, _ = calc_attn(*local, key)
        full = undispatch(out, key).narrow(0, 0, b * n)
        return layouts.shard(from_packed(full, b), self.layout, self.rank, self.world)

    def hooks(self):
        return (Hook(dist, "all_to_all_single", "all_to_all", alltoallv_sends),
                Hook(dist, "all_gather_into_tensor", "all_gather", gather_sends))
