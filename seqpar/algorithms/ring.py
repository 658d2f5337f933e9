"""`ring` (Ring Attention): K,V shards travel the ring for P-1 steps; each step's partial result is
merged with the online softmax. The exchange that brings the next block is posted before the current
block is computed (two buffers), so communication overlaps compute. Backward: K,V travel again with
their dK,dV accumulators, which arrive home after the last step ((P-1) K,V and P dK,dV messages,
the latter in the accumulation dtype by default, `Options.grad_dtype`).

`travel` is the one ring schedule (usp's context ring, the double ring's inner and outer rings,
burst's topology-aware ring and WallFacer's sub-rings run it too); `carry` is the one backward over
it (a block's gradient follows the block and comes home). With skip_transfers every message follows
`route` (rules/route.py), which every rank derives from the global relation, so sender and receiver
agree; the ledger books skipped messages apart and `skipped_ring_bytes` counts them. How far a block
travels, with examples, and each algorithm's bytes: docs/algorithms.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from seqpar.algorithms import blocks, kernels, layouts
from seqpar.algorithms.base import Algorithm
from seqpar.algorithms.comm import Comm, Handle
from seqpar.algorithms.latent import UpProjection
from seqpar.algorithms.mesh import Mesh
from seqpar.rules import route
from seqpar.rules.algorithms.ring import (  # noqa: F401 (the rules, also from here)
    RingRules,
    ring_bytes,
    skipped_ring_bytes,
)
from seqpar.rules.groups import NestedRing

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
            return cls(ring, ring, Comm.solo("outer", ring.global_ranks[ring.rank],
                                             order=ring.order))
        return cls(ring, mesh.comm("inner"), mesh.comm("outer"))

    @property
    def schedule(self) -> NestedRing:
        return NestedRing(self.ring.size, self.inner.size, self.ring.rank)


def plan_of(comms: RingComms, need: route.Need | None) -> route.Plan:
    """This rank's route on the ring of `comms` (need=None: every block travels the whole ring)."""
    return route.plan(comms.ring.size, comms.inner.size, comms.ring.rank, need)


def _nbytes(t: torch.Tensor, dtype: torch.dtype | None = None) -> int:
    return t.numel() * (dtype or t.dtype).itemsize


def travel(comms: RingComms, kv: torch.Tensor,
           plan: route.Plan | None = None) -> Iterator[tuple[int, int, torch.Tensor | None]]:
    """Yield (global step, source position, block or None) at every step of the ring: the block
    that started at the source position as it passes this rank (None: it does not travel here,
    see `route`).

    The exchange that brings the next block is posted before a block is yielded, so it overlaps
    the caller's compute on it. With inner rings each outer step also posts, at its start and on
    the outer ring's communicator, the prefetch of the next inner ring's first block from the
    previous inner ring, which overlaps the whole inner ring. Messages the plan skips are booked
    in the ledger as skipped (`Ledger.skipped`).
    """
    plan = plan or plan_of(comms, None)
    ring, inner, outer = comms.schedule, comms.inner, comms.outer
    w = ring.inner
    start: torch.Tensor | None = kv
    for o in range(-(-plan.steps // w)):
        prefetch = None
        if plan.fetch_send[o] or plan.fetch_recv[o]:
            prefetch = outer.exchange(
                [(start, outer.peer(1))] if plan.fetch_send[o] else [],
                [(torch.empty_like(kv), outer.peer(-1))] if plan.fetch_recv[o] else [],
                tag=OUTER_TAG)
        block = start
        for s in range(min(w, plan.steps - o * w)):
            g = o * w + s
            pending = None
            if plan.hop_send[g] or plan.hop_recv[g]:
                pending = inner.exchange(
                    [(block, inner.peer(1))] if plan.hop_send[g] else [],
                    [(torch.empty_like(kv), inner.peer(-1))] if plan.hop_recv[g] else [],
                    tag=KV_TAG)
            yield g, ring.source(o, s), block if plan.held[g] else None
            got = pending.wait() if pending is not None else []
            block = got[0] if plan.hop_recv[g] else None
        got = prefetch.wait() if prefetch is not None else []
        start = got[0] if plan.fetch_recv[o] else None
    for g in range(plan.size):  # what the unskipped ring would have sent besides
        if g % w < w - 1 and not plan.hop_send[g]:
            inner.skip(_nbytes(kv), inner.peer(1))
    for o in range(plan.size // w - 1):
        if not plan.fetch_send[o]:
            outer.skip(_nbytes(kv), outer.peer(1))


def carry(comms: RingComms, payload: torch.Tensor, plan: route.Plan,
          compute: Callable[[torch.Tensor, int], torch.Tensor], grad_like: torch.Tensor,
          grad_dtype: torch.dtype) -> torch.Tensor:
    """Backward on a ring: `payload` travels as in `travel`; for every block this rank needs,
    compute(block, src) returns the block's gradient contribution, which is added to the
    accumulator that arrived with it and sent on to the block's next reader, or home after its
    last (`route`). Returns this rank's own block's gradient (zeros shaped like grad_like when no
    one needs the block)."""
    ring = comms.schedule
    w = ring.inner
    arrivals: dict[int, tuple[Handle, int]] = {}  # consumed at step (or HOME) -> (handle, index)
    outgoing: list[Handle] = []  # exchanges that send: waited before returning
    own = None
    # one gradient exchange per communicator and step, the inner ring's first, on every rank
    # (a plain ring's inner ring is the ring itself: one exchange)
    order = [comms.inner] if comms.inner is comms.ring else [comms.inner, comms.ring]

    def on(via_inner: bool) -> int:
        return 0 if via_inner or len(order) == 1 else 1

    def group_rank(pos: int, via_inner: bool) -> int:
        return pos % w if via_inner and len(order) > 1 else pos

    for g, src, block in travel(comms, payload, plan):
        grad = None
        if block is not None and plan.needed[g]:
            grad = compute(block, src)
            if g in arrivals:
                handle, i = arrivals.pop(g)
                grad += handle.wait()[i]
        if g == 0 and plan.home == "kept":
            own = grad
        posts: list[tuple[list, list, list[int]]] = [([], [], []) for _ in order]
        if plan.grad_to[g] is not None:
            to, via_inner = plan.grad_to[g]
            posts[on(via_inner)][0].append((grad.to(grad_dtype), group_rank(to, via_inner)))
        for frm, at, via_inner in plan.grad_from[g]:
            sends, recvs, purpose = posts[on(via_inner)]
            recvs.append((torch.empty(grad_like.shape, dtype=grad_dtype,
                                      device=grad_like.device), group_rank(frm, via_inner)))
            purpose.append(at)
        for comm, (sends, recvs, purpose) in zip(order, posts, strict=True):
            if sends or recvs:
                handle = comm.exchange(sends, recvs, tag=GRAD_TAG)
                arrivals.update({at: (handle, i) for i, at in enumerate(purpose)})
                if sends:
                    outgoing.append(handle)
    for g in range(plan.size if plan.size > 1 else 0):  # skipped gradient messages
        if plan.grad_to[g] is None:
            s = g % w
            comm, p = ((comms.inner, comms.inner.peer(1)) if s < w - 1
                       else (comms.ring, ring.grad_peers(s)[0]))
            comm.skip(_nbytes(grad_like, grad_dtype), p)
    for handle in outgoing:
        handle.wait()
    if plan.home == "arrives":
        handle, i = arrivals.pop(route.HOME)
        return handle.wait()[i]
    if own is not None:
        return own
    return torch.zeros(grad_like.shape, dtype=kernels.acc_dtype(grad_like.dtype),
                       device=grad_like.device)


def ring_forward(q: torch.Tensor, kv: torch.Tensor, comms: RingComms, tasks_for: TasksFor,
                 acc_out: torch.Tensor, acc_lse: torch.Tensor, backend: str,
                 scale: float | None, plan: route.Plan | None = None,
                 kv_index: torch.Tensor | None = None, fresh: bool = False,
                 rebuild: UpProjection | None = None) -> None:
    """Merge attention over every position's kv into the accumulators; `tasks_for(src)` plans the
    block that started at position src. `kv_index` (usp with K,V head ranges): the K,V head of
    each query head within the travelling block, expanded locally before the kernel. `fresh`:
    the accumulators hold nothing yet (`blocks.new_partial`), so each row's first result is
    copied in, not merged (`blocks.Seen`). `rebuild` (mla_pass latent): kv is MLA's latent, and
    each block's K,V are rebuilt from it on arrival."""
    seen = blocks.Seen() if fresh else None
    for _, src, block in travel(comms, kv, plan):
        if block is not None:
            k, v = (rebuild.kv(block) if rebuild is not None
                    else _expanded(block, kv_index, q, backend))
            blocks.forward_tasks(q, k, v, tasks_for(src), acc_out, acc_lse, backend, scale, seen)


def _expanded(block: torch.Tensor, kv_index: torch.Tensor | None, q: torch.Tensor, backend: str
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of a block for q's kernel calls: index_select makes the dense copies itself."""
    if kv_index is None:
        return blocks.kv_of(block, q, backend)
    k, v = blocks.unpack_kv(block, q.shape[-1], dense=False)
    return k.index_select(2, kv_index), v.index_select(2, kv_index)


def ring_backward(dout: torch.Tensor, q: torch.Tensor, kv: torch.Tensor, out: torch.Tensor,
                  lse: torch.Tensor, comms: RingComms, tasks_for: TasksFor, dq: torch.Tensor,
                  backend: str, scale: float | None, grad_dtype: torch.dtype,
                  plan: route.Plan | None = None,
                  kv_index: torch.Tensor | None = None,
                  rebuild: UpProjection | None = None) -> torch.Tensor:
    """Add dq in place; return this rank's own dK,dV (packed) after they have travelled home.

    K,V move as in `ring_forward`; each block's dK,dV accumulator follows its block one step
    behind (`size` hops in all, unskipped), in `grad_dtype`. With `kv_index` the gradients of the
    expanded heads are summed back into the block's own heads before they travel. With `rebuild`
    the latent travels, K,V are rebuilt again, and the latent's gradient (through the
    up-projection) is what follows the block home; wkv_b's part stays in `rebuild.dw`.
    """
    def compute(block: torch.Tensor, src: int) -> torch.Tensor:
        if rebuild is not None:
            k, v = rebuild.kv(block)
            dk, dv = blocks.zeros_acc(k), blocks.zeros_acc(v)
            blocks.backward_tasks(dout, q, k, v, out, lse, tasks_for(src), dq, dk, dv, backend,
                                  scale)
            return rebuild.backward(block, dk, dv)
        k, v = _expanded(block, kv_index, q, backend)
        if kv_index is None:  # dK and dV accumulate in the two parts of one packed buffer
            dkv = blocks.zeros_acc(block)
            dk, dv = blocks.unpack_kv(dkv, q.shape[-1], dense=False)
        else:
            dk, dv = blocks.zeros_acc(k), blocks.zeros_acc(v)
        blocks.backward_tasks(dout, q, k, v, out, lse, tasks_for(src), dq, dk, dv, backend, scale)
        if kv_index is None:
            return dkv
        dkv = blocks.zeros_acc(block)
        for part, g in zip(blocks.unpack_kv(dkv, q.shape[-1], dense=False), (dk, dv),
                           strict=True):
            part.index_add_(2, kv_index, g)
        return dkv

    return carry(comms, kv, plan or plan_of(comms, None), compute, kv, grad_dtype)






class Ring(RingRules, Algorithm):
    takes_sinks = True

    def tasks_for(self, seq_len: int) -> TasksFor:
        def tasks(src: int) -> Sequence[layouts.Task]:  # this rank's queries, src's keys
            return layouts.layout_tasks(self.layout, self.world, seq_len, self.rank, src,
                                        self.relation)
        return tasks

    def need(self, seq_len: int) -> route.Need | None:
        """need[pos][src] of this call (None: skip_transfers off, every block travels)."""
        if not self.options.skips(self.relation):
            return None
        return layouts.layout_need(self.layout, self.world, seq_len, self.relation)

    def forward(self, q, k, v):
        seq_len = q.shape[1] * self.world
        tasks_for = self.tasks_for(seq_len)
        comms = RingComms.of(self.mesh)
        plan = plan_of(comms, self.need(seq_len))
        acc_out, acc_lse = blocks.new_partial(q, v.shape[-1])
        ring_forward(q, blocks.pack_kv(k, v), comms, tasks_for, acc_out, acc_lse, self.backend,
                     self.scale, plan, fresh=True)
        out = self.sink(acc_out, acc_lse).to(q.dtype)
        return out, (q, k, v, out, acc_lse), (tasks_for, plan)

    def backward(self, dout, saved, state):
        q, k, v, out, lse = saved
        tasks_for, plan = state
        dout, dsinks = self.unsink(dout, out, lse)
        dq = blocks.zeros_acc(q)
        dkv = ring_backward(dout, q, blocks.pack_kv(k, v), out, lse, RingComms.of(self.mesh),
                            tasks_for, dq, self.backend, self.scale, self.grad_dtype(k), plan)
        dk, dv = blocks.unpack_kv(dkv, k.shape[-1])
        return dq, dk, dv, dsinks

    # -- MLA with the latent on the ring (mla_pass latent, `algorithms.latent`) --------------------
    def latent_forward(self, q, latent, wkv_b):
        seq_len = q.shape[1] * self.world
        tasks_for, comms = self.tasks_for(seq_len), RingComms.of(self.mesh)
        plan = plan_of(comms, self.need(seq_len))
        up = UpProjection(q, latent, wkv_b)
        acc_out, acc_lse = blocks.new_partial(q, up.v_dim)
        ring_forward(q, latent, comms, tasks_for, acc_out, acc_lse, self.backend, self.scale, plan,
                     fresh=True, rebuild=up)
        out = self.sink(acc_out, acc_lse).to(q.dtype)
        return out, (q, latent, wkv_b, out, acc_lse), (tasks_for, plan)

    def latent_backward(self, dout, saved, state):
        q, latent, wkv_b, out, lse = saved
        tasks_for, plan = state
        dout, dsinks = self.unsink(dout, out, lse)
        dq, up = blocks.zeros_acc(q), UpProjection(q, latent, wkv_b)
        dlatent = ring_backward(dout, q, latent, out, lse, RingComms.of(self.mesh), tasks_for, dq,
                                self.backend, self.scale, self.grad_dtype(q), plan, rebuild=up)
        return dq, dlatent, up.dw, dsinks
