"""`burst` (BurstAttention, BurstEngine §3.1, §3.4): ring attention with a topology-aware ring and a
backward pass that moves the queries instead of the keys and values.

Forward: `ring.ring_forward` on the topology-aware ring (Fig. 4): one sub-ring per node, and one
inter-node step per node that moves every rank's round-start K,V block to the same position on the
next node. Three buffers — the block being computed, the intra-node receive, the inter-node receive —
so both kinds of transfer overlap compute (Fig. 5). Bytes equal the ring's; only (nodes - 1) of a
rank's P - 1 messages cross nodes, and every rank's NIC carries one of them at a time.

Backward (Alg. 2): K, V, dK, dV stay home. Q, dO, lse and D = rowsum(dO * O) travel the same ring in
one message; dQ follows its block one step behind (a gradient can only leave after it is computed,
Fig. 5) and after the last step arrives home. With D instead of O on the wire, a step moves
2Hd + 2H numbers per token plus Hd for dQ: ~(3Nd + 2N) against ring's 4Nd for MHA, but H-headed
tensors against ring's Hkv-headed ones, so with GQA (H/Hkv = 4) burst sends more than ring.

The node map: option `ranks_per_node` (nodes are blocks of consecutive ranks); by default the process
topology (`ledger.set_topology`), else one node. A group whose nodes do not hold equal blocks of
consecutive ranks gets the flat ring (still exact, just not topology-aware).

`query_ring_backward` and the byte packing are shared with `wallfacer`, whose sub-rings run the same
query-moving backward.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from seqpar.algorithms import blocks, groups, layouts, ledger
from seqpar.algorithms.base import AlgorithmSpec, AttnShape, Context
from seqpar.algorithms.comm import Comm
from seqpar.algorithms.groups import DoubleRing
from seqpar.algorithms.kernels import acc_dtype
from seqpar.algorithms.ring import ring_bytes, ring_forward, travel
from seqpar.errors import require

DQ_TAG = 21
Spec = tuple[tuple[int, ...], torch.dtype]


# ----------------------------------------------------------------------------------- byte packing
def pack_bytes(tensors: Sequence[torch.Tensor]) -> tuple[torch.Tensor, tuple[Spec, ...]]:
    """One uint8 buffer holding tensors of mixed dtypes, so they travel in one message.

    Put the widest dtypes first: a view at a byte offset must be aligned to its element size.
    """
    flat = [t.contiguous().reshape(-1).view(torch.uint8) for t in tensors]
    return torch.cat(flat), tuple((tuple(t.shape), t.dtype) for t in tensors)


def unpack_bytes(buf: torch.Tensor, specs: Sequence[Spec]) -> list[torch.Tensor]:
    out, offset = [], 0
    for shape, dtype in specs:
        n = torch.Size(shape).numel() * dtype.itemsize
        out.append(buf[offset:offset + n].view(dtype).view(shape))
        offset += n
    return out


# ------------------------------------------------------------------------------------- D and O'
def rowsum_delta(dout: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """D = rowsum(dO * O) per token and head, (B, s, H), in the accumulation dtype."""
    work = acc_dtype(out.dtype)
    return (dout.to(work) * out.to(work)).sum(-1)


def out_for_delta(dout: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """An O' with rowsum(dO * O') = D, for the kernels that take O and compute D themselves.

    O' = dO * D / |dO|²; a row with dO = 0 has D = 0 and gets O' = 0.
    """
    work = delta.dtype
    norm = dout.to(work).square().sum(-1)
    scale = torch.where(norm > 0, delta / torch.where(norm > 0, norm, 1), 0)
    return (dout.to(work) * scale.unsqueeze(-1)).to(dout.dtype)


def query_parts(q: torch.Tensor, dout: torch.Tensor, delta: torch.Tensor,
                lse: torch.Tensor) -> list[torch.Tensor]:
    """What a query block's backward needs elsewhere, widest dtype first (see pack_bytes):
    D and lse (B, s, H) in the accumulation dtype, then q and dO."""
    return [delta, lse.transpose(1, 2), q, dout]


def query_backward(parts: Sequence[torch.Tensor], k: torch.Tensor, v: torch.Tensor,
                   tasks: Sequence[layouts.Task], dk: torch.Tensor, dv: torch.Tensor,
                   backend: str, scale: float | None) -> torch.Tensor:
    """dq of a visiting query block (query_parts) against this rank's K,V; adds into dk, dv."""
    delta, lse, q, dout = parts
    dq = blocks.zeros_acc(q)
    blocks.backward_tasks(dout, q, k, v, out_for_delta(dout, delta), lse.transpose(1, 2), tasks,
                          dq, dk, dv, backend, scale)
    return dq


# ---------------------------------------------------------------------------- the query ring
def query_ring_backward(parts: Sequence[torch.Tensor], comm: Comm, ring: DoubleRing,
                        compute: Callable[[list[torch.Tensor], int], torch.Tensor],
                        dq_dtype: torch.dtype) -> torch.Tensor:
    """BurstAttention Alg. 2 on `ring`: the query blocks (`parts`, packed into one message) visit
    every rank; compute(parts, src) returns the dq of the block that started at position src and
    adds its dK,dV into the caller's accumulators. Returns this rank's own dq, arrived home."""
    bundle, specs = pack_bytes(parts)
    grad_in = None  # the travelling dq of the block held this step, from its last holder
    dq = None
    for step, src, block in travel(comm, bundle, ring):
        dq = compute(unpack_bytes(block, specs), src)
        if grad_in is not None:
            (arrived,) = grad_in.wait()
            dq += arrived
        if comm.size > 1:
            dq = dq.to(dq_dtype)
            to, frm = ring.grad_peers(step)
            grad_in = comm.exchange([(dq, to)], [(torch.empty_like(dq), frm)], tag=DQ_TAG)
    if grad_in is None:
        return dq
    (home,) = grad_in.wait()
    return home


def query_ring_bytes(q_bytes: int, dq_bytes: int, world: int) -> int:
    """Backward bytes one rank sends on a query ring of `world`: the block P - 1 times, dq P times."""
    return 0 if world == 1 else (world - 1) * q_bytes + world * dq_bytes


# ---------------------------------------------------------------------------------- the Function
def ring_of(c: Context) -> DoubleRing:
    """This rank's topology-aware ring (see the module docstring for where the node map comes from)."""
    per_node = c.options.get("ranks_per_node")
    if per_node is not None:
        nodes = [g // per_node for g in c.comm.global_ranks]
    elif ledger._topology is not None:
        nodes = [ledger._topology[g] for g in c.comm.global_ranks]
    else:
        nodes = [0] * c.world
    return groups.burst_ring(nodes, c.rank)


class _BurstAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, c: Context):
        seq_len, ring = q.shape[1] * c.world, ring_of(c)

        def tasks_for(src: int):  # this rank's queries against the K,V of src
            return layouts.layout_tasks(c.layout, c.world, seq_len, c.rank, src, c.causal)

        acc_out, acc_lse = blocks.new_partial(q)
        ring_forward(q, blocks.pack_kv(k, v), c.comm, tasks_for, acc_out, acc_lse, c.backend,
                     c.scale, inner=ring.inner)
        out = acc_out.to(q.dtype)
        ctx.c, ctx.ring, ctx.ledgers = c, ring, ledger.active()
        ctx.save_for_backward(q, k, v, out, acc_lse)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        c, seq_len = ctx.c, q.shape[1] * ctx.c.world
        dk, dv = blocks.zeros_acc(k), blocks.zeros_acc(v)

        def compute(parts: list[torch.Tensor], src: int) -> torch.Tensor:
            tasks = layouts.layout_tasks(c.layout, c.world, seq_len, src, c.rank, c.causal)
            return query_backward(parts, k, v, tasks, dk, dv, c.backend, c.scale)

        dout = dout.contiguous()
        parts = query_parts(q, dout, rowsum_delta(dout, out), lse)
        with ledger.backward_of(ctx.ledgers):
            dq = query_ring_backward(parts, c.comm, ctx.ring, compute, q.dtype)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, c: Context) -> torch.Tensor:
    return _BurstAttention.apply(q, k, v, c)


def rules(shape: AttnShape, world: int, options: Mapping[str, Any]) -> None:
    per_node = options.get("ranks_per_node")
    require(per_node is None or (isinstance(per_node, int) and per_node >= 1), "ranks_per_node",
            per_node, "must be a positive integer (or None: the process topology)")


def query_block_bytes(shape: AttnShape, world: int, tokens_factor: int = 1) -> tuple[int, int]:
    """(query block message, dq message) bytes for a block of tokens_factor shards: q and dO in the
    input dtype, D and lse in the accumulation dtype (float64 for float64, else float32)."""
    u = shape.unit(world) * tokens_factor
    acc = 8 if shape.elem_bytes == 8 else 4
    stats = 2 * shape.batch * (shape.seq_len // world) * tokens_factor * shape.heads * acc
    return 2 * shape.heads * u + stats, shape.heads * u


def expected_bytes(shape: AttnShape, world: int, options: Mapping[str, Any]) -> dict[str, int]:
    block, dq = query_block_bytes(shape, world)
    forward = ring_bytes(2 * shape.kv_heads * shape.unit(world), world)["forward"]
    return {"forward": forward, "backward": query_ring_bytes(block, dq, world)}


SPEC = AlgorithmSpec(
    "burst", "topology-aware ring (intra-node sub-rings + inter-node step); backward moves "
    "Q, dO, D, lse and dQ, K,V stay home", run, rules, expected_bytes,
    options={"ranks_per_node": None})
