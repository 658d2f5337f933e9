"""`ring` (Ring Attention): K,V shards travel the ring for P-1 steps; each step's partial result is
merged with the online softmax. The exchange that brings the next block is posted before the current
block is computed, so communication overlaps compute (two buffers).

Backward: K,V travel the ring again while each block's dK,dV accumulator travels with it, and after
the last step the accumulators arrive home: (P-1) K,V messages and P dK,dV messages (the latter in
the accumulation dtype by default, see `Options.grad_dtype`).

`travel` is the one ring schedule: it also runs usp's context ring and the double ring (inner rings
of w with the outer ring's prefetch on its own communicator, LoongTrain Alg. 2), burst's
topology-aware ring and WallFacer's sub-rings.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from seqpar.algorithms import blocks, layouts
from seqpar.algorithms.base import Algorithm, AttnShape
from seqpar.algorithms.comm import Comm
from seqpar.algorithms.groups import DoubleRing
from seqpar.algorithms.mesh import Mesh
from seqpar.algorithms.options import Options

KV_TAG, GRAD_TAG, OUTER_TAG = 11, 12, 13
TasksFor = Callable[[int], Sequence[layouts.Task]]


@dataclass(frozen=True)
class RingComms:
    """A ring of `ring.size` positions split into inner rings: `ring` is the whole ring (group rank
    = position), `inner` this rank's inner ring (group rank = t), `outer` its outer ring (group
    rank = i), for position i * inner + t. With one inner ring, inner is the ring itself."""

    ring: Comm
    inner: Comm
    outer: Comm

    @classmethod
    def of(cls, mesh: Mesh, ring_axis: str = "sp") -> RingComms:
        ring = mesh.comm(ring_axis)
        if "inner" not in mesh.comms:
            return cls(ring, ring, Comm.solo("outer", ring.global_ranks[ring.rank]))
        return cls(ring, mesh.comm("inner"), mesh.comm("outer"))

    @property
    def schedule(self) -> DoubleRing:
        return DoubleRing(self.ring.size, self.inner.size, self.ring.rank)


def travel(comms: RingComms, kv: torch.Tensor) -> Iterator[tuple[int, int, torch.Tensor]]:
    """Yield (inner step, source position, block) for every block as it passes this rank.

    The exchange that brings the next block is posted before a block is yielded, so it overlaps
    the caller's compute on it. With inner rings each outer step also posts, at its start and on
    the outer ring's communicator, the prefetch of the next inner ring's first block from the
    previous inner ring, which overlaps the whole inner ring.
    """
    ring, inner, outer = comms.schedule, comms.inner, comms.outer
    for outer_step in range(ring.outer):
        prefetch = None
        if outer_step < ring.outer - 1:
            prefetch = outer.exchange([(kv, outer.peer(1))],
                                      [(torch.empty_like(kv), outer.peer(-1))], tag=OUTER_TAG)
        block = kv
        for step in range(ring.inner):
            pending = None
            if step < ring.inner - 1:
                pending = inner.exchange([(block, inner.peer(1))],
                                         [(torch.empty_like(block), inner.peer(-1))], tag=KV_TAG)
            yield step, ring.source(outer_step, step), block
            if pending is not None:
                (block,) = pending.wait()
        if prefetch is not None:
            (kv,) = prefetch.wait()


def pass_grad(comms: RingComms, step: int, grad: torch.Tensor):
    """Send a travelling gradient on after inner step `step` and post the receive of the next one:
    inside an inner ring to the next member, after its last step one hop diagonally on the whole
    ring (see `DoubleRing.grad_peers`)."""
    ring = comms.schedule
    if step < ring.inner - 1:
        comm, to, frm = comms.inner, comms.inner.peer(1), comms.inner.peer(-1)
    else:
        comm = comms.ring
        to, frm = ring.grad_peers(step)
    return comm.exchange([(grad, to)], [(torch.empty_like(grad), frm)], tag=GRAD_TAG)


def ring_forward(q: torch.Tensor, kv: torch.Tensor, comms: RingComms, tasks_for: TasksFor,
                 acc_out: torch.Tensor, acc_lse: torch.Tensor, backend: str,
                 scale: float | None) -> None:
    """Merge attention over every position's kv into the accumulators; `tasks_for(src)` plans the
    block that started at position src."""
    for _, src, block in travel(comms, kv):
        k, v = blocks.unpack_kv(block)
        blocks.forward_tasks(q, k, v, tasks_for(src), acc_out, acc_lse, backend, scale)


def ring_backward(dout: torch.Tensor, q: torch.Tensor, kv: torch.Tensor, out: torch.Tensor,
                  lse: torch.Tensor, comms: RingComms, tasks_for: TasksFor, dq: torch.Tensor,
                  backend: str, scale: float | None, grad_dtype: torch.dtype) -> torch.Tensor:
    """Add dq in place; return this rank's own dK,dV (packed) after they have travelled home.

    K,V move as in `ring_forward`; each block's dK,dV accumulator follows its block one step
    behind, `size` hops in all, in `grad_dtype`.
    """
    grad_in = None  # the travelling dK,dV of the block held this step, arriving from its last holder
    dkv = None
    for step, src, block in travel(comms, kv):
        k, v = blocks.unpack_kv(block)
        dk, dv = blocks.zeros_acc(k), blocks.zeros_acc(v)
        blocks.backward_tasks(dout, q, k, v, out, lse, tasks_for(src), dq, dk, dv, backend, scale)
        dkv = blocks.pack_kv(dk, dv)
        if grad_in is not None:
            (arrived,) = grad_in.wait()
            dkv += arrived
        if comms.ring.size > 1:
            grad_in = pass_grad(comms, step, dkv.to(grad_dtype))
    if grad_in is None:
        return dkv
    (home,) = grad_in.wait()
    return home


def ring_bytes(kv_bytes: int, world: int, grad_bytes: int | None = None) -> dict[str, int]:
    """Bytes one rank sends in a ring of `world` whose K,V message is kv_bytes and whose dK,dV
    message is grad_bytes (default kv_bytes)."""
    if world == 1:
        return {"forward": 0, "backward": 0}
    grad_bytes = kv_bytes if grad_bytes is None else grad_bytes
    return {"forward": (world - 1) * kv_bytes,
            "backward": (world - 1) * kv_bytes + world * grad_bytes}


class Ring(Algorithm):
    name = "ring"
    summary = "K,V shards travel a ring; online-softmax merge; overlapped p2p"

    def tasks_for(self, seq_len: int) -> TasksFor:
        def tasks(src: int) -> Sequence[layouts.Task]:  # this rank's queries, src's keys
            return layouts.layout_tasks(self.layout, self.world, seq_len, self.rank, src,
                                        self.relation)
        return tasks

    def forward(self, q, k, v):
        tasks_for = self.tasks_for(q.shape[1] * self.world)
        acc_out, acc_lse = blocks.new_partial(q)
        ring_forward(q, blocks.pack_kv(k, v), RingComms.of(self.mesh), tasks_for, acc_out,
                     acc_lse, self.backend, self.scale)
        out = acc_out.to(q.dtype)
        return out, (q, k, v, out, acc_lse), tasks_for

    def backward(self, dout, saved, tasks_for):
        q, k, v, out, lse = saved
        dq = blocks.zeros_acc(q)
        dkv = ring_backward(dout, q, blocks.pack_kv(k, v), out, lse, RingComms.of(self.mesh),
                            tasks_for, dq, self.backend, self.scale, self.grad_dtype(k))
        dk, dv = blocks.unpack_kv(dkv)
        return dq, dk, dv

    @classmethod
    def expected_bytes(cls, shape: AttnShape, world: int, options: Options) -> dict[str, int]:
        kv = 2 * shape.kv_heads * shape.unit(world)
        grad = 2 * shape.kv_heads * shape.grad_unit(world, options)
        return ring_bytes(kv, world, grad)
