"""`peer:te-cp`: TransformerEngine's context parallelism (`transformer_engine.pytorch
.DotProductAttention` with a `cp_group`), its fused or flash kernels: CUDA only.

The module is built once per (heads, kv heads, head dim, mask) with `qkv_format="bshd"` and the
sequence-parallel group as `cp_group` (`cp_global_ranks` its members, `cp_comm_type` from the option
`comm`: p2p, all_gather, a2a). For a causal call TE expects the load-balanced dealing of 2P chunks
(rank r: chunks r and 2P-1-r), seqpar's zigzag. It returns (B, S, H*D), which the adapter views as
(B, S, H, D). The bytes are booked from its torch.distributed calls (batched and single p2p, all
gathers, all-to-alls); no analytic count is modelled for it (`expected_bytes` says so). Its
options and rules: `seqpar.rules.peers.TransformerEngineCpRules`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from seqpar.peers.adapter import AutogradPeer
from seqpar.peers.booking import P2P_HOOK, Hook, equal_alltoall_sends, gather_sends, nbytes
from seqpar.rules.peers import TransformerEngineCpRules


def isend_sends(comm: Any, tensor: torch.Tensor, dst: int | None = None, *args: Any,
                **kwargs: Any) -> dict[int, int]:
    """dist.isend(tensor, dst (a global rank), group)."""
    dst = kwargs.get("dst", dst)
    return {comm.global_ranks.index(dst): nbytes(tensor)}


def te_arguments(heads: int, kv_heads: int, head_dim: int, causal: bool, scale: float | None,
                 group: Any, ranks: list[int], stream: Any, comm: str) -> dict[str, Any]:
    """DotProductAttention's constructor arguments for this call (its documented names)."""
    return {"num_attention_heads": heads, "kv_channels": head_dim, "num_gqa_groups": kv_heads,
            "attention_dropout": 0.0, "qkv_format": "bshd",
            "attn_mask_type": "causal" if causal else "no_mask", "softmax_scale": scale,
            "cp_group": group, "cp_global_ranks": ranks, "cp_stream": stream,
            "cp_comm_type": comm}


class TransformerEngineCp(TransformerEngineCpRules, AutogradPeer):
    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._modules: dict[tuple, Any] = {}

    def module(self, q: torch.Tensor, k: torch.Tensor) -> Any:
        key = (q.shape[2], k.shape[2], q.shape[3], q.dtype)
        if key not in self._modules:
            from transformer_engine.pytorch import DotProductAttention

            args = te_arguments(q.shape[2], k.shape[2], q.shape[3], self.causal, self.scale,
                                self.comm.group, self.comm.global_ranks, torch.cuda.Stream(),
                                self.options.comm)
            self._modules[key] = DotProductAttention(**args).to(q.device)
        return self._modules[key]

    def run(self, q, k, v):
        out = self.module(q, k)(q, k, v)
        return out.view(*q.shape)

    def hooks(self):
        return (P2P_HOOK, Hook(dist, "isend", "p2p", isend_sends),
                Hook(dist, "all_gather_into_tensor", "all_gather", gather_sends),
                Hook(dist, "all_to_all_single", "all_to_all", equal_alltoall_sends))
