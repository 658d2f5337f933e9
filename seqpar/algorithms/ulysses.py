"""`ulysses` (DeepSpeed-Ulysses): all-to-all from sequence shards to head shards, full-sequence
attention on H/P heads, all-to-all back.

When kv_heads < P, K and V heads are replicated to P heads before the all-to-all and the replicas'
gradients summed after (LoongTrain §4.2). After the all-to-all a rank holds the group's shards in rank
order; `tokens.gather_plan` permutes them into token order for the kernel (a local copy, no
communication; none at all for the contiguous layout) and back afterwards.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from seqpar.algorithms import blocks, tokens
from seqpar.algorithms.base import Algorithm, AttnShape, divides
from seqpar.algorithms.comm import Comm
from seqpar.algorithms.options import Options
from seqpar.errors import require


def kv_replicas(kv_heads: int, world: int) -> int:
    """How many copies of each K/V head the all-to-all needs (1 when kv_heads >= world)."""
    return 1 if kv_heads >= world else world // kv_heads


def replicate_kv(k: torch.Tensor, v: torch.Tensor, reps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each K/V head `reps` times over (LoongTrain §4.2), so the all-to-all can split them."""
    if reps == 1:
        return k, v
    return k.repeat_interleave(reps, dim=2), v.repeat_interleave(reps, dim=2)


def sum_replicas(dk: torch.Tensor, dv: torch.Tensor, reps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The backward of replicate_kv: the replicas' gradients belong to one K/V head."""
    if reps == 1:
        return dk, dv
    b, s, h, d = dk.shape
    return (dk.view(b, s, h // reps, reps, d).sum(3), dv.view(b, s, h // reps, reps, d).sum(3))


def check_kv_split(kv_heads: int, ways: int, what: str) -> None:
    """kv_heads must split `ways` ways, or be replicated up to it."""
    require(kv_heads % ways == 0 or ways % kv_heads == 0, "kv_heads", kv_heads,
            f"must be a multiple or a divisor of {what} ({ways}) so K,V heads can be split or "
            "replicated")


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


def seq_alltoall_bytes(shape: AttnShape, group: int, world: int, kv_heads: int) -> int:
    """Bytes one rank sends in one phase's all-to-alls over a head-parallel group of `group`
    ranks inside a sequence-parallel group of `world`: q, k, v (or dout) in, out (or dq, dk, dv)
    back, each (group-1)/group of its input. kv_heads counts replicated K,V heads (LoongTrain
    §4.5.4: AlltoAll_Volume = sum over q, k, v, out of Size x (dhp-1)/dhp)."""
    heads_per_member = 2 * (shape.heads // group) + 2 * (kv_heads // group)
    return (group - 1) * heads_per_member * shape.unit(world)


class Ulysses(Algorithm):
    name = "ulysses"
    summary = "all-to-all sequence->heads, full attention on H/P heads"

    def forward(self, q, k, v):
        seq_len = q.shape[1] * self.world
        plan = tokens.gather_plan(self.layout, self.world, seq_len, (tuple(range(self.world)),),
                                  self.relation)
        reps = kv_replicas(k.shape[2], self.world)
        k, v = replicate_kv(k, v, reps)
        qh, kh, vh = seq_to_heads([q, k, v], self.comm, plan.order(0, q.device))
        tasks = plan.tasks(0, 0)
        out_h, lse = blocks.attend_tasks(qh, kh, vh, tasks, self.backend, self.scale)
        (out,) = heads_to_seq([out_h], self.comm, plan.inverse(0, q.device))
        return out, (qh, kh, vh, out_h, lse), (plan, reps, tasks)

    def backward(self, dout, saved, state):
        qh, kh, vh, out_h, lse = saved
        plan, reps, tasks = state
        (doh,) = seq_to_heads([dout], self.comm, plan.order(0, dout.device))
        grads = blocks.grads_tasks(doh, qh, kh, vh, out_h, lse, tasks, self.backend, self.scale)
        dq, dk, dv = heads_to_seq([g.to(qh.dtype) for g in grads], self.comm,
                                  plan.inverse(0, dout.device))
        dk, dv = sum_replicas(dk, dv, reps)
        return dq, dk, dv

    @classmethod
    def rules(cls, shape: AttnShape, world: int, options: Options) -> None:
        divides("heads", shape.heads, world)
        check_kv_split(shape.kv_heads, world, "the world size")

    @classmethod
    def expected_bytes(cls, shape: AttnShape, world: int, options: Options) -> dict[str, int]:
        kv_heads = shape.kv_heads * kv_replicas(shape.kv_heads, world)
        both = seq_alltoall_bytes(shape, world, world, kv_heads)
        return {"forward": both, "backward": both}
