"""`ring` (Ring Attention): K,V shards travel the ring for P-1 steps; each step's partial result is
merged with the online softmax. Communication of the next step overlaps the current step's compute
(asynchronous send/recv into a second buffer).

Backward: K,V travel the ring again while each block's dK,dV accumulator travels with it, and after
the last step the accumulators arrive home: (P-1) + P messages of 2*Hkv*u bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from seqpar.algorithms import blocks, layouts, ledger
from seqpar.algorithms.base import AlgorithmSpec, AttnShape, Context
from seqpar.algorithms.comm import Comm

KV_TAG, GRAD_TAG = 11, 12


def ring_forward(q, kv, comm: Comm, tasks_for, acc_out, acc_lse, backend, scale) -> None:
    """Merge attention over every rank's kv into the accumulators; `tasks_for(src)` plans a block.

    Shared with the double ring: `comm` is the ring's group, `src` a rank of that group.
    """
    world, nxt, prv = comm.size, comm.peer(1), comm.peer(-1)
    for step in range(world):
        pending = None
        if step < world - 1:
            pending = comm.exchange([(kv, nxt)], [(torch.empty_like(kv), prv)], tag=KV_TAG)
        k, v = blocks.unpack_kv(kv)
        blocks.forward_tasks(q, k, v, tasks_for(comm.peer(-step)), acc_out, acc_lse,
                             backend, scale)
        if pending is not None:
            (kv,) = pending.wait()


def ring_backward(dout, q, kv, out, lse, comm: Comm, tasks_for, dq, backend, scale):
    """Add dq in place; return this rank's own dK,dV (packed) after they have travelled home."""
    world, nxt, prv = comm.size, comm.peer(1), comm.peer(-1)
    grad_in = None  # the travelling dK,dV of the block held this step, arriving from prv
    for step in range(world):
        pending = None
        if step < world - 1:
            pending = comm.exchange([(kv, nxt)], [(torch.empty_like(kv), prv)], tag=KV_TAG)
        k, v = blocks.unpack_kv(kv)
        dk, dv = blocks.zeros_acc(k), blocks.zeros_acc(v)
        blocks.backward_tasks(dout, q, k, v, out, lse, tasks_for(comm.peer(-step)),
                              dq, dk, dv, backend, scale)
        dkv = blocks.pack_kv(dk, dv)
        if grad_in is not None:
            (arrived,) = grad_in.wait()
            dkv += arrived
        if world > 1:
            dkv = dkv.to(kv.dtype)
            grad_in = comm.exchange([(dkv, nxt)], [(torch.empty_like(dkv), prv)], tag=GRAD_TAG)
        if pending is not None:
            (kv,) = pending.wait()
    if grad_in is None:
        return dkv
    (home,) = grad_in.wait()
    return home


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, c: Context):
        seq_len = q.shape[1] * c.world

        def tasks_for(src: int):
            return layouts.layout_tasks(c.layout, c.world, seq_len, c.rank, src, c.causal)

        acc_out, acc_lse = blocks.new_partial(q)
        ring_forward(q, blocks.pack_kv(k, v), c.comm, tasks_for, acc_out, acc_lse,
                     c.backend, c.scale)
        out = acc_out.to(q.dtype)
        ctx.c, ctx.tasks_for, ctx.ledgers = c, tasks_for, ledger.active()
        ctx.save_for_backward(q, k, v, out, acc_lse)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        c = ctx.c
        dq = blocks.zeros_acc(q)
        with ledger.backward_of(ctx.ledgers):
            dkv = ring_backward(dout.contiguous(), q, blocks.pack_kv(k, v), out, lse, c.comm,
                                ctx.tasks_for, dq, c.backend, c.scale)
        dk, dv = blocks.unpack_kv(dkv.to(k.dtype))
        return dq.to(q.dtype), dk, dv, None


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, c: Context) -> torch.Tensor:
    return _RingAttention.apply(q, k, v, c)


def rules(shape: AttnShape, world: int, options: Mapping[str, Any]) -> None:
    """No rule beyond the layout's: any world size, any head count."""


def ring_bytes(kv_bytes: int, world: int) -> dict[str, int]:
    """Bytes one rank sends in a ring of `world` whose K,V message is kv_bytes."""
    if world == 1:
        return {"forward": 0, "backward": 0}
    return {"forward": (world - 1) * kv_bytes, "backward": (2 * world - 1) * kv_bytes}


def expected_bytes(shape: AttnShape, world: int, options: Mapping[str, Any]) -> dict[str, int]:
    return ring_bytes(2 * shape.kv_heads * shape.unit(world), world)


SPEC = AlgorithmSpec("ring", "K,V shards travel a ring; online-softmax merge; overlapped p2p",
                     run, rules, expected_bytes)
