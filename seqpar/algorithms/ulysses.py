"""`ulysses` (DeepSpeed-Ulysses): all-to-all from sequence shards to head shards, full-sequence
attention on H/P heads, all-to-all back.

When kv_heads < P, K and V heads are replicated to P heads before the all-to-all and the replicas'
gradients summed after (LoongTrain §4.2). After the all-to-all a rank holds the group's shards in rank
order; for zigzag and stripe that is not token order, so the tokens are permuted into token order
for the kernel and back afterwards (a local copy, no communication).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from seqpar.algorithms import blocks, layouts, ledger
from seqpar.algorithms.base import AlgorithmSpec, AttnShape, Context, divides
from seqpar.algorithms.comm import Comm
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


def _inverse(order: torch.Tensor) -> torch.Tensor:
    inv = torch.empty_like(order)
    inv[order] = torch.arange(order.numel())
    return inv


def gathered_positions(layout: str, world: int, seq_len: int,
                       members: Sequence[int] | None = None) -> torch.Tensor:
    """Token positions a rank holds after the all-to-all over `members` (default: all `world`
    ranks of the layout): the members' shards concatenated in group-rank order."""
    members = range(world) if members is None else members
    return torch.cat([layouts.positions(layout, r, world, seq_len) for r in members])


def _token_order(layout: str, world: int, seq_len: int,
                 members: Sequence[int] | None = None) -> torch.Tensor | None:
    return layouts.sort_order(gathered_positions(layout, world, seq_len, members))


def seq_to_heads(tensors: Sequence[torch.Tensor], comm: Comm,
                 order: torch.Tensor | None) -> list[torch.Tensor]:
    """One all-to-all: sequence shards -> head shards for every tensor; then the gathered
    sequence is permuted by `order` (None: keep rank order)."""
    out = comm.all_to_all(list(tensors), scatter_dim=2, gather_dim=1)
    if order is None:
        return out
    idx = order.to(out[0].device)
    return [t.index_select(1, idx) for t in out]


def heads_to_seq(tensors: Sequence[torch.Tensor], comm: Comm,
                 order: torch.Tensor | None) -> list[torch.Tensor]:
    """Inverse of `seq_to_heads`: undo `order`, then one all-to-all head shards -> sequence shards."""
    if order is not None:
        inv = _inverse(order).to(tensors[0].device)
        tensors = [t.index_select(1, inv) for t in tensors]
    return comm.all_to_all(list(tensors), scatter_dim=1, gather_dim=2)


def seq_alltoall_bytes(shape: AttnShape, group: int, world: int, kv_heads: int) -> int:
    """Bytes one rank sends in one phase's all-to-alls over a head-parallel group of `group`
    ranks inside a sequence-parallel group of `world`: q, k, v (or dout) in, out (or dq, dk, dv)
    back, each (group-1)/group of its input. kv_heads counts replicated K,V heads (LoongTrain
    §4.5.4: AlltoAll_Volume = sum over q, k, v, out of Size x (dhp-1)/dhp)."""
    heads_per_member = 2 * (shape.heads // group) + 2 * (kv_heads // group)
    return (group - 1) * heads_per_member * shape.unit(world)


def heads_attention_forward(q, k, v, comm: Comm, order, causal, backend, scale):
    """ulysses' forward: a2a seq->heads, attention, a2a heads->seq (usp shares the two a2a halves).

    `order` sorts the gathered sequence into the order `causal` needs (None: already sorted).
    Returns out and what the backward needs."""
    qh, kh, vh = seq_to_heads([q, k, v], comm, order)
    n = qh.shape[1]
    tasks = layouts.block_tasks(torch.arange(n), torch.arange(n), causal)
    acc_out, acc_lse = blocks.new_partial(qh)
    blocks.forward_tasks(qh, kh, vh, tasks, acc_out, acc_lse, backend, scale)
    out_h = acc_out.to(q.dtype)
    (out,) = heads_to_seq([out_h], comm, order)
    return out, (qh, kh, vh, out_h, acc_lse, tasks)


def heads_attention_backward(dout, saved, comm: Comm, order, backend, scale):
    qh, kh, vh, out_h, lse, tasks = saved
    (doh,) = seq_to_heads([dout.contiguous()], comm, order)
    dq, dk, dv = (blocks.zeros_acc(t) for t in (qh, kh, vh))
    blocks.backward_tasks(doh, qh, kh, vh, out_h, lse, tasks, dq, dk, dv, backend, scale)
    return heads_to_seq([g.to(qh.dtype) for g in (dq, dk, dv)], comm, order)


class _UlyssesAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, c: Context):
        reps = kv_replicas(k.shape[2], c.world)
        k, v = replicate_kv(k, v, reps)
        order = _token_order(c.layout, c.world, q.shape[1] * c.world)
        out, saved = heads_attention_forward(q, k, v, c.comm, order, c.causal, c.backend, c.scale)
        ctx.c, ctx.order, ctx.reps, ctx.saved, ctx.ledgers = c, order, reps, saved, ledger.active()
        return out

    @staticmethod
    def backward(ctx, dout):
        c = ctx.c
        with ledger.backward_of(ctx.ledgers):
            dq, dk, dv = heads_attention_backward(dout, ctx.saved, c.comm, ctx.order,
                                                  c.backend, c.scale)
        ctx.saved = None
        dk, dv = sum_replicas(dk, dv, ctx.reps)
        return dq, dk, dv, None


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, c: Context) -> torch.Tensor:
    return _UlyssesAttention.apply(q, k, v, c)


def rules(shape: AttnShape, world: int, options: Mapping[str, Any]) -> None:
    divides("heads", shape.heads, world)
    check_kv_split(shape.kv_heads, world, "the world size")


def expected_bytes(shape: AttnShape, world: int, options: Mapping[str, Any]) -> dict[str, int]:
    kv_heads = shape.kv_heads * kv_replicas(shape.kv_heads, world)
    both = seq_alltoall_bytes(shape, world, world, kv_heads)
    return {"forward": both, "backward": both}


SPEC = AlgorithmSpec("ulysses", "all-to-all sequence->heads, full attention on H/P heads",
                     run, rules, expected_bytes)
