"""`allgather`: gather K and V from every rank, attend locally, reduce-scatter dK and dV.

Forward sends (P-1) * 2Hkv * u bytes per rank; backward keeps the gathered K, V and sends only the
reduce-scatter of dK, dV: (P-1)/P * 2Hkv * P * u.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from seqpar.algorithms import blocks, layouts, ledger
from seqpar.algorithms.base import AlgorithmSpec, AttnShape, Context


def _gathered_positions(c: Context, seq_len: int) -> torch.Tensor:
    return torch.cat([layouts.positions(c.layout, r, c.world, seq_len) for r in range(c.world)])


class _AllGatherAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, c: Context):
        seq_len = q.shape[1] * c.world
        kv = c.comm.all_gather(blocks.pack_kv(k, v), dim=1)  # rank order
        order = layouts.sort_order(_gathered_positions(c, seq_len))
        if order is not None:  # token order, so the causal mask is a prefix mask
            kv = kv.index_select(1, order.to(kv.device))
        k_all, v_all = blocks.unpack_kv(kv)
        q_pos = layouts.positions(c.layout, c.rank, c.world, seq_len)
        tasks = layouts.block_tasks(q_pos, torch.arange(seq_len), c.causal)
        acc_out, acc_lse = blocks.new_partial(q)
        blocks.forward_tasks(q, k_all, v_all, tasks, acc_out, acc_lse, c.backend, c.scale)
        out = acc_out.to(q.dtype)
        ctx.c, ctx.tasks, ctx.order, ctx.ledgers = c, tasks, order, ledger.active()
        ctx.save_for_backward(q, k_all, v_all, out, acc_lse)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k_all, v_all, out, lse = ctx.saved_tensors
        c = ctx.c
        dq, dk_all, dv_all = (blocks.zeros_acc(t) for t in (q, k_all, v_all))
        with ledger.backward_of(ctx.ledgers):
            blocks.backward_tasks(dout.contiguous(), q, k_all, v_all, out, lse, ctx.tasks,
                                  dq, dk_all, dv_all, c.backend, c.scale)
            dkv = blocks.pack_kv(dk_all, dv_all).to(q.dtype)
            if ctx.order is not None:  # back to rank order before the reduce-scatter
                inverse = torch.empty_like(ctx.order)
                inverse[ctx.order] = torch.arange(ctx.order.numel())
                dkv = dkv.index_select(1, inverse.to(dkv.device))
            dk, dv = blocks.unpack_kv(c.comm.reduce_scatter(dkv, dim=1))
        return dq.to(q.dtype), dk, dv, None


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, c: Context) -> torch.Tensor:
    return _AllGatherAttention.apply(q, k, v, c)


def rules(shape: AttnShape, world: int, options: Mapping[str, Any]) -> None:
    """No rule beyond the layout's: any world size, any head count."""


def expected_bytes(shape: AttnShape, world: int, options: Mapping[str, Any]) -> dict[str, int]:
    kv = 2 * shape.kv_heads * shape.unit(world)
    return {"forward": (world - 1) * kv, "backward": (world - 1) * kv}


SPEC = AlgorithmSpec("allgather", "all-gather K,V; local attention; reduce-scatter dK,dV",
                     run, rules, expected_bytes)
