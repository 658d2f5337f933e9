"""`peer:ring-flash-zigzag` and `peer:ring-flash-llama3`: zhuzilin's ring-flash-attention
(package `ring-flash-attn`, which imports flash-attn at import time: CUDA only).

- zigzag: `zigzag_ring_flash_attn_func(q, k, v, softmax_scale=, causal=True, group=)` on bshd
  shards in the zigzag layout (rank r holds chunks r and 2P-1-r of 2P: seqpar's zigzag). K,V travel
  P-1 hops a phase (point to point, `batch_isend_irecv`); the dK,dV accumulators (float32) P hops.
- llama3: `llama3_flash_attn_varlen_func` (Llama 3's context parallelism: all-gather K,V by
  `heads_k_stride` heads, attend, reduce-scatter dK,dV) on the contiguous layout. It takes packed
  (total tokens, heads, dim) varlen input: each batch row is one document of N tokens whose
  cu_seqlens `llama3_flash_attn_prepare_cu_seqlens` turns into this rank's slice (`varlen_args`).

Their rules and bytes: `seqpar.rules.peers` (`RingFlashZigzagRules`, `RingFlashLlama3Rules`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from seqpar.peers.adapter import AutogradPeer
from seqpar.peers.booking import P2P_HOOK, Hook, gather_sends, scatter_sends
from seqpar.rules.peers import RingFlashLlama3Rules, RingFlashZigzagRules


class RingFlashZigzag(RingFlashZigzagRules, AutogradPeer):
    def run(self, q, k, v):
        from ring_flash_attn import zigzag_ring_flash_attn_func

        return zigzag_ring_flash_attn_func(q, k, v, softmax_scale=self.scale, causal=True,
                                           group=self.comm.group)

    def hooks(self):
        return (P2P_HOOK,)


def varlen_args(seq_len: int, rank: int, world: int, causal: bool, device: torch.device,
                prepare: Callable[..., tuple] | None = None) -> dict[str, Any]:
    """The llama3 function's cu_seqlens arguments for one document of `seq_len` tokens dealt
    contiguously over `world` ranks, as `prepare` (ring-flash-attention's
    `llama3_flash_attn_prepare_cu_seqlens`) computes them."""
    if prepare is None:
        from ring_flash_attn import llama3_flash_attn_prepare_cu_seqlens as prepare

    cu = torch.tensor([0, seq_len], dtype=torch.int32, device=device)
    cu_q, cu_k, max_q, max_k, local_k = prepare(cu, causal, rank, world)
    return {"cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k, "max_seqlen_q": max_q,
            "max_seqlen_k": max_k, "local_k_slice": local_k}


class RingFlashLlama3(RingFlashLlama3Rules, AutogradPeer):
    def run(self, q, k, v):
        from ring_flash_attn import llama3_flash_attn_varlen_func

        args = varlen_args(q.shape[1] * self.world, self.rank, self.world, self.causal, q.device)
        stride = self.options.heads_k_stride or k.shape[2]
        rows = [llama3_flash_attn_varlen_func(q[b], k[b], v[b], heads_k_stride=stride,
                                              softmax_scale=self.scale, causal=self.causal,
                                              group=self.comm.group, **args)
                for b in range(q.shape[0])]  # one document per batch row
        return torch.stack(rows)

    def hooks(self):
        return (Hook(dist, "all_gather_into_tensor", "all_gather", gather_sends),
                Hook(dist, "reduce_scatter_tensor", "reduce_scatter", scatter_sends))
