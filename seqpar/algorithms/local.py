"""`local`: no parallelism (P = 1). The baseline row of every study, on the same kernels."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from seqpar.algorithms import blocks, layouts, ledger
from seqpar.algorithms.base import AlgorithmSpec, AttnShape, Context
from seqpar.errors import require


class _LocalAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, c: Context):
        tasks = layouts.block_tasks(torch.arange(q.shape[1]), torch.arange(k.shape[1]), c.causal)
        acc_out, acc_lse = blocks.new_partial(q)
        blocks.forward_tasks(q, k, v, tasks, acc_out, acc_lse, c.backend, c.scale)
        out = acc_out.to(q.dtype)
        ctx.c, ctx.tasks, ctx.ledgers = c, tasks, ledger.active()
        ctx.save_for_backward(q, k, v, out, acc_lse)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        c = ctx.c
        dq, dk, dv = (blocks.zeros_acc(t) for t in (q, k, v))
        with ledger.backward_of(ctx.ledgers):
            blocks.backward_tasks(dout.contiguous(), q, k, v, out, lse, ctx.tasks, dq, dk, dv,
                                  c.backend, c.scale)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, c: Context) -> torch.Tensor:
    return _LocalAttention.apply(q, k, v, c)


def rules(shape: AttnShape, world: int, options: Mapping[str, Any]) -> None:
    require(world == 1, "world", world, "local runs on one rank only (world must be 1)")


def expected_bytes(shape: AttnShape, world: int, options: Mapping[str, Any]) -> dict[str, int]:
    return {"forward": 0, "backward": 0}


SPEC = AlgorithmSpec("local", "no parallelism: one rank attends to the whole sequence",
                     run, rules, expected_bytes)
