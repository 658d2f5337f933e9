"""`burst` (BurstAttention, BurstEngine §3.1, §3.4): ring attention on a topology-aware ring, with a
backward pass that moves the queries instead of the keys and values.

Forward: `ring.ring_forward` on one sub-ring per node plus one inter-node step per node (Fig. 4),
with three buffers (the block being computed, the intra-node and the inter-node receive) so both
kinds of transfer overlap compute (Fig. 5). Backward (Alg. 2): K, V, dK, dV stay home; Q, dO, lse and
D = rowsum(dO * O) travel the ring in one message, and dQ follows its block one step behind and
arrives home after the last step. `query_ring_backward` and the byte packing (`pack_bytes`: every
segment at a 16-byte boundary, the padding booked and counted by `packed_size`) are shared with
`wallfacer`.

The rank grid (mesh.py) is `(outer, inner)`, one inner ring per node: the node map from option
`ranks_per_node`, else the mesh's nodes, else one node; nodes that are not equal blocks of
consecutive ranks get the flat ring (exact, not topology-aware). With skip_transfers the backward's
query blocks travel only as far as the last rank whose keys they see (`route.transpose` of the
forward's need); `ring_inner` is the inner ring the analytic count assumes. Bytes against ring's
(more with GQA): docs/algorithms.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from seqpar.algorithms import blocks, layouts
from seqpar.algorithms.kernels import acc_dtype
from seqpar.algorithms.latent import UpProjection
from seqpar.algorithms.ring import Ring, RingComms, carry, plan_of
from seqpar.rules import route
from seqpar.rules.algorithms.burst import (  # noqa: F401 (the rules, also from here)
    ALIGN,
    BurstOptions,
    BurstRules,
    aligned,
    packed_size,
    query_block_bytes,
    query_ring_bytes,
    skipped_query_ring_bytes,
)

Spec = tuple[tuple[int, ...], torch.dtype]


# ----------------------------------------------------------------------------------- byte packing




def pack_bytes(tensors: Sequence[torch.Tensor]) -> tuple[torch.Tensor, tuple[Spec, ...]]:
    """One uint8 buffer holding tensors of mixed dtypes, each at a 16-byte boundary, so they
    travel in one message and every view of it is aligned."""
    sizes = [t.numel() * t.element_size() for t in tensors]
    buf = torch.zeros(packed_size(sizes), dtype=torch.uint8, device=tensors[0].device)
    offset = 0
    for t, n in zip(tensors, sizes, strict=True):
        buf[offset:offset + n] = t.contiguous().reshape(-1).view(torch.uint8)
        offset += aligned(n)
    return buf, tuple((tuple(t.shape), t.dtype) for t in tensors)


def unpack_bytes(buf: torch.Tensor, specs: Sequence[Spec]) -> list[torch.Tensor]:
    out, offset = [], 0
    for shape, dtype in specs:
        n = torch.Size(shape).numel() * dtype.itemsize
        out.append(buf[offset:offset + n].view(dtype).view(shape))
        offset += aligned(n)
    return out


# ------------------------------------------------------------------------------------- D and O'
def rowsum_delta(dout: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """D = rowsum(dO * O) per token and head, (B, s, H), in the accumulation dtype (a batched dot
    product: no product tensor the size of O)."""
    work = acc_dtype(out.dtype)
    return torch.einsum("...d,...d->...", dout.to(work), out.to(work))


def out_for_delta(dout: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """An O' with rowsum(dO * O') = D, for the kernels that take O and compute D themselves.

    O' = dO * D / |dO|²; a row with dO = 0 has D = 0 and gets O' = 0. Built once per visiting
    query block: |dO|² reduced in the accumulation dtype, then dO scaled by the float32 scale and
    written in its own dtype (one rounding). On CUDA the kernels cast as they read, so that is two
    passes over dO and one new tensor in dO's dtype; elsewhere a 16-bit dO is read through one
    float32 copy, scaled in place.
    """
    if dout.dtype == delta.dtype or dout.is_cuda:
        norm = torch.linalg.vector_norm(dout, dim=-1, dtype=delta.dtype).square_()
        scale = torch.where(norm > 0, delta / norm, 0).unsqueeze(-1)
        return torch.mul(dout, scale, out=torch.empty_like(dout))
    work = dout.to(delta.dtype)
    norm = torch.linalg.vector_norm(work, dim=-1).square_()
    return work.mul_(torch.where(norm > 0, delta / norm, 0).unsqueeze(-1)).to(dout.dtype)


def query_parts(q: torch.Tensor, dout: torch.Tensor, delta: torch.Tensor,
                lse: torch.Tensor) -> list[torch.Tensor]:
    """What a query block's backward needs elsewhere: D and lse (B, s, H) in the accumulation
    dtype, then q and dO."""
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
def query_ring_backward(parts: Sequence[torch.Tensor], comms: RingComms,
                        compute: Callable[[list[torch.Tensor], int], torch.Tensor],
                        dq_dtype: torch.dtype, plan: route.Plan | None = None) -> torch.Tensor:
    """BurstAttention Alg. 2 on a ring: the query blocks (`parts`, packed into one message) visit
    every position (`plan`: those whose keys they see, see `route`); compute(parts, src) returns
    the dq of the block that started at position src and adds its dK,dV into the caller's
    accumulators. Returns this rank's own dq, arrived home."""
    bundle, specs = pack_bytes(parts)
    return carry(comms, bundle, plan or plan_of(comms, None),
                 lambda block, src: compute(unpack_bytes(block, specs), src), parts[2], dq_dtype)








# ---------------------------------------------------------------------------------- the algorithm



class Burst(BurstRules, Ring):
    """Forward: ring's, on the topology-aware ring the grid lays out (RingComms of the mesh's
    inner and outer axes). Backward: Alg. 2, the query ring."""

    def backward(self, dout, saved, state):
        q, k, v, out, lse = saved
        dout, dsinks = self.unsink(dout, out, lse)
        return (*self.query_ring(dout, q, k, v, out, lse), dsinks)

    def latent_backward(self, dout, saved, state):
        """K,V stay home: rebuilt once from this rank's own latent, their gradients taken back
        through the up-projection once; no latent travels in backward."""
        q, latent, wkv_b, out, lse = saved
        dout, dsinks = self.unsink(dout, out, lse)
        up = UpProjection(q, latent, wkv_b)
        dq, dk, dv = self.query_ring(dout, q, *up.kv(latent), out, lse)
        return dq, up.backward(latent, dk, dv), up.dw, dsinks

    def query_ring(self, dout, q, k, v, out, lse):
        """(dq, dk, dv) of Alg. 2: this rank's queries travel, its K,V stay."""
        seq_len = q.shape[1] * self.world
        dk, dv = blocks.zeros_acc(k), blocks.zeros_acc(v)

        def compute(parts: list[torch.Tensor], src: int) -> torch.Tensor:
            tasks = layouts.layout_tasks(self.layout, self.world, seq_len, src, self.rank,
                                         self.relation)
            return query_backward(parts, k, v, tasks, dk, dv, self.backend, self.scale)

        comms = RingComms.of(self.mesh)
        need = self.need(seq_len)
        plan = plan_of(comms, None if need is None else route.transpose(need))
        parts = query_parts(q, dout, rowsum_delta(dout, out), lse)
        dq = query_ring_backward(parts, comms, compute, self.grad_dtype(q), plan)
        return dq, dk, dv
