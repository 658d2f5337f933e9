"""`ring` (Ring Attention): K,V shards travel the ring for P-1 steps; each step's partial result is
merged with the online softmax. Communication of the next step overlaps the current step's compute
(asynchronous send/recv into a second buffer).

Backward: K,V travel the ring again while each block's dK,dV accumulator travels with it, and after
the last step the accumulators arrive home: (P-1) + P messages of 2*Hkv*u bytes.

`ring_forward` / `ring_backward` also run usp's context-parallel ring and the double ring: with
`inner` < P the ring is split into inner rings (LoongTrain Alg. 2, see `travel`), same bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from seqpar.algorithms import blocks, layouts, ledger
from seqpar.algorithms.base import AlgorithmSpec, AttnShape, Context
from seqpar.algorithms.comm import Comm
from seqpar.algorithms.groups import DoubleRing

KV_TAG, GRAD_TAG, OUTER_TAG = 11, 12, 13


def travel(comm: Comm, kv: torch.Tensor, ring: DoubleRing):
    """Yield (inner step, source position, K,V block) for every block as it passes this rank.

    The exchange that brings the next block is posted before a block is yielded, so it overlaps
    the caller's compute on it. With inner rings (LoongTrain Alg. 2) each outer step also posts,
    at its start, the prefetch of the next inner ring's first block from the previous inner ring,
    which overlaps the whole inner ring. With one inner ring this is the plain ring.
    """
    for outer_step in range(ring.outer):
        prefetch = None
        if outer_step < ring.outer - 1:
            prefetch = comm.exchange([(kv, ring.next_outer)],
                                     [(torch.empty_like(kv), ring.prev_outer)], tag=OUTER_TAG)
        block = kv
        for step in range(ring.inner):
            pending = None
            if step < ring.inner - 1:
                pending = comm.exchange([(block, ring.next_inner)],
                                        [(torch.empty_like(block), ring.prev_inner)], tag=KV_TAG)
            yield step, ring.source(outer_step, step), block
            if pending is not None:
                (block,) = pending.wait()
        if prefetch is not None:
            (kv,) = prefetch.wait()


def ring_forward(q, kv, comm: Comm, tasks_for, acc_out, acc_lse, backend, scale,
                 inner: int | None = None) -> None:
    """Merge attention over every rank's kv into the accumulators; `tasks_for(src)` plans a block.

    Shared with usp and the double ring: `comm` is the ring's group, `src` a rank of that group;
    `inner` (a divisor of the ring size; default the whole ring) is the inner ring size.
    """
    ring = DoubleRing(comm.size, inner or comm.size, comm.rank)
    for _, src, block in travel(comm, kv, ring):
        k, v = blocks.unpack_kv(block)
        blocks.forward_tasks(q, k, v, tasks_for(src), acc_out, acc_lse, backend, scale)


def ring_backward(dout, q, kv, out, lse, comm: Comm, tasks_for, dq, backend, scale,
                  inner: int | None = None):
    """Add dq in place; return this rank's own dK,dV (packed) after they have travelled home.

    K,V move as in `ring_forward`; each block's dK,dV accumulator follows its block one step
    behind (see `DoubleRing.grad_peers`), `size` hops in all.
    """
    ring = DoubleRing(comm.size, inner or comm.size, comm.rank)
    grad_in = None  # the travelling dK,dV of the block held this step, arriving from its last holder
    for step, src, block in travel(comm, kv, ring):
        k, v = blocks.unpack_kv(block)
        dk, dv = blocks.zeros_acc(k), blocks.zeros_acc(v)
        blocks.backward_tasks(dout, q, k, v, out, lse, tasks_for(src), dq, dk, dv, backend, scale)
        dkv = blocks.pack_kv(dk, dv)
        if grad_in is not None:
            (arrived,) = grad_in.wait()
            dkv += arrived
        if comm.size > 1:
            dkv = dkv.to(kv.dtype)
            to, frm = ring.grad_peers(step)
            grad_in = comm.exchange([(dkv, to)], [(torch.empty_like(dkv), frm)], tag=GRAD_TAG)
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
