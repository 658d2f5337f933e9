"""`ulysses` (DeepSpeed-Ulysses): all-to-all from sequence shards to head shards, full-sequence
attention on H/P heads, all-to-all back.

When kv_heads < P, K and V heads are replicated to P heads before the all-to-all and the replicas'
gradients summed after (LoongTrain §4.2). After the all-to-all a rank holds the group's shards in rank
order; `tokens.gather_plan` permutes them into token order for the kernel (a local copy, no
communication; none at all for the contiguous layout) and back afterwards.

When kv_heads is neither a multiple nor a divisor of P (H=6, Hkv=2, P=3), member j's query heads
[j*H/P, (j+1)*H/P) read the K,V heads `kv_ranges(...)[j]`: each rank sends every member exactly
those heads of its shard (a point-to-point exchange of unequal messages, `kv_to_heads`), expands them
locally to one K,V head per query head (a copy, no communication) and, in backward, sums the copies'
gradients and sends each member's dK,dV heads back (`kv_grads_to_seq`). Bytes per rank:
`head_plan_bytes`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from seqpar.algorithms import blocks, tokens
from seqpar.algorithms.base import Algorithm
from seqpar.algorithms.comm import Comm
from seqpar.rules.algorithms.ulysses import (  # noqa: F401 (the rules, also from here)
    UlyssesRules,
    head_plan_bytes,
    kv_ranges,
    kv_replicas,
    seq_alltoall_bytes,
)


def replicate_kv(k: torch.Tensor, v: torch.Tensor, reps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each K/V head `reps` times over (LoongTrain §4.2), so the all-to-all can split them."""
    if reps == 1:
        return k, v
    return k.repeat_interleave(reps, dim=2), v.repeat_interleave(reps, dim=2)


def sum_replicas(dk: torch.Tensor, dv: torch.Tensor, reps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The backward of replicate_kv: the replicas' gradients belong to one K/V head."""
    if reps == 1:
        return dk, dv
    return dk.unflatten(2, (-1, reps)).sum(3), dv.unflatten(2, (-1, reps)).sum(3)


def seq_to_heads(tensors: Sequence[torch.Tensor], comm: Comm,
                 order: torch.Tensor | None) -> list[torch.Tensor]:
    """One all-to-all: sequence shards -> head shards for every tensor; then the gathered
    sequence is permuted by `order` (None: keep member order)."""
    out = comm.all_to_all(list(tensors), scatter_dim=2, gather_dim=1)
    return [blocks.permute(t, order) for t in out]


def heads_to_seq(tensors: Sequence[torch.Tensor], comm: Comm,
                 inverse: torch.Tensor | None) -> list[torch.Tensor]:
    """Inverse of `seq_to_heads`: undo the order, then one all-to-all head shards -> sequence."""
    return comm.all_to_all([blocks.permute(t, inverse) for t in tensors], scatter_dim=1,
                           gather_dim=2)




KV_HEADS_TAG = 21


def head_shard(comm: Comm, per: int) -> slice:
    """The query heads (of every member's) this member holds after `seq_to_heads`, `per` each."""
    return slice(comm.rank * per, (comm.rank + 1) * per)




def local_kv_index(heads: int, kv_heads: int, ways: int, member: int) -> torch.Tensor:
    """For each of member's query heads, the index of its K,V head among the member's range."""
    per, group = heads // ways, heads // kv_heads
    lo = kv_ranges(heads, kv_heads, ways)[member][0]
    return torch.tensor([h // group - lo for h in range(member * per, (member + 1) * per)])


def kv_to_heads(k: torch.Tensor, v: torch.Tensor, comm: Comm, ranges: list[tuple[int, int]],
                order: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Member j receives K,V heads ranges[j] of every member's shard (and only those): the whole
    gathered sequence in member order, then permuted by `order`."""
    me, g = comm.rank, comm.size
    pieces = [blocks.pack_kv(k[:, :, lo:hi], v[:, :, lo:hi]) for lo, hi in ranges]
    bufs = {i: torch.empty(pieces[me].shape, dtype=k.dtype, device=k.device)
            for i in range(g) if i != me}
    got = comm.exchange([(pieces[j], j) for j in range(g) if j != me],
                        list((b, i) for i, b in bufs.items()), tag=KV_HEADS_TAG).wait()
    received = dict(zip(bufs, got, strict=True))
    kv = blocks.permute(torch.cat([pieces[me] if i == me else received[i] for i in range(g)],
                                  dim=1), order)
    return blocks.unpack_kv(kv, k.shape[-1], dense=False)


def kv_grads_to_seq(dkh: torch.Tensor, dvh: torch.Tensor, comm: Comm,
                    ranges: list[tuple[int, int]], inverse: torch.Tensor | None,
                    kv_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of `kv_to_heads`: each member's shard of this rank's dK,dV heads goes back to it;
    the heads that several members read are summed where they arrive."""
    me, g = comm.rank, comm.size
    grads = blocks.permute(blocks.pack_kv(dkh, dvh), inverse)
    shards = list(grads.chunk(g, dim=1))
    b, s, _, d = shards[0].shape
    bufs = {j: torch.empty(b, s, ranges[j][1] - ranges[j][0], d, dtype=grads.dtype,
                           device=grads.device) for j in range(g) if j != me}
    got = comm.exchange([(shards[i].contiguous(), i) for i in range(g) if i != me],
                        list((buf, j) for j, buf in bufs.items()), tag=KV_HEADS_TAG).wait()
    received = dict(zip(bufs, got, strict=True))
    received[me] = shards[me]
    dkv = torch.zeros(b, s, kv_heads, d, dtype=grads.dtype, device=grads.device)
    for j, (lo, hi) in enumerate(ranges):
        dkv[:, :, lo:hi] += received[j]
    return blocks.unpack_kv(dkv, dkh.shape[-1])




class Ulysses(UlyssesRules, Algorithm):
    takes_sinks = True

    def forward(self, q, k, v):
        seq_len = q.shape[1] * self.world
        plan = tokens.gather_plan(self.layout, self.world, seq_len, (tuple(range(self.world)),),
                                  self.relation)
        ranges = kv_ranges(q.shape[2], k.shape[2], self.world)
        if ranges is not None:
            return self._forward_ranges(q, k, v, plan, ranges)
        reps = kv_replicas(k.shape[2], self.world)
        k, v = replicate_kv(k, v, reps)
        qh, kh, vh = seq_to_heads([q, k, v], self.comm, plan.order(0, q.device))
        tasks = plan.tasks(0, 0)
        out_h, lse = blocks.attend_tasks(qh, kh, vh, tasks, self.backend, self.scale)
        out_h = self.sink(out_h, lse, head_shard(self.comm, qh.shape[2]))
        (out,) = heads_to_seq([out_h], self.comm, plan.inverse(0, q.device))
        return out, (qh, kh, vh, out_h, lse), (plan, reps, tasks)

    def _forward_ranges(self, q, k, v, plan, ranges):
        (qh,) = seq_to_heads([q], self.comm, plan.order(0, q.device))
        kh, vh = kv_to_heads(k, v, self.comm, ranges, plan.order(0, q.device))
        index = local_kv_index(q.shape[2], k.shape[2], self.world, self.comm.rank).to(q.device)
        kx, vx = kh.index_select(2, index), vh.index_select(2, index)  # one K,V per query head
        tasks = plan.tasks(0, 0)
        out_h, lse = blocks.attend_tasks(qh, kx, vx, tasks, self.backend, self.scale)
        out_h = self.sink(out_h, lse, head_shard(self.comm, qh.shape[2]))
        (out,) = heads_to_seq([out_h], self.comm, plan.inverse(0, q.device))
        return out, (qh, kx, vx, out_h, lse), (plan, ranges, tasks, index, k.shape[2])

    def _backward_ranges(self, dout, saved, state):
        qh, kx, vx, out_h, lse = saved
        plan, ranges, tasks, index, kv_heads = state
        (doh,) = seq_to_heads([dout], self.comm, plan.order(0, dout.device))
        doh, dsinks = self.unsink(doh, out_h, lse, head_shard(self.comm, qh.shape[2]))
        dq, dkx, dvx = blocks.grads_tasks(doh, qh, kx, vx, out_h, lse, tasks, self.backend,
                                          self.scale)
        lo, hi = ranges[self.comm.rank]
        dkh, dvh = (torch.zeros(*g.shape[:2], hi - lo, g.shape[3], dtype=g.dtype, device=g.device)
                    .index_add_(2, index, g).to(qh.dtype) for g in (dkx, dvx))
        (dq,) = heads_to_seq([dq.to(qh.dtype)], self.comm, plan.inverse(0, dout.device))
        dk, dv = kv_grads_to_seq(dkh, dvh, self.comm, ranges, plan.inverse(0, dout.device),
                                 kv_heads)
        return dq, dk, dv, dsinks

    def backward(self, dout, saved, state):
        if len(state) == 5:
            return self._backward_ranges(dout, saved, state)
        qh, kh, vh, out_h, lse = saved
        plan, reps, tasks = state
        (doh,) = seq_to_heads([dout], self.comm, plan.order(0, dout.device))
        doh, dsinks = self.unsink(doh, out_h, lse, head_shard(self.comm, qh.shape[2]))
        grads = blocks.grads_tasks(doh, qh, kh, vh, out_h, lse, tasks, self.backend, self.scale)
        dq, dk, dv = heads_to_seq([g.to(qh.dtype) for g in grads], self.comm,
                                  plan.inverse(0, dout.device))
        dk, dv = sum_replicas(dk, dv, reps)
        return dq, dk, dv, dsinks
