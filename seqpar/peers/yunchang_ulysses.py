"""`peer:yunchang-ulysses`: yunchang's `UlyssesAttention` (its `SeqAllToAll4D` all-to-alls of q, k,
v and out around a local kernel), as its users run it.

The local kernel sits in the module's `attn_fn` slot. With flash-attn installed on CUDA it is
yunchang's own (`AttnType.FA`: `flash_attn_func`). Elsewhere (CPU, or float64) yunchang has no
kernel of the flash_attn_func shape that is not a ring (its `TORCH_*` types put its ring over the
whole world there), so the slot holds torch's SDPA on the gathered sequence, the same CPU kernel
(`_scaled_dot_product_flash_attention_for_cpu`) seqpar's `torch` backend runs: the pair compares
the orchestration on one kernel. Only `yunchang` (pure Python, no dependency besides torch) is
needed; it imports flash_attn only when present.

Its rules and bytes: `seqpar.rules.peers.YunchangUlyssesRules`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from seqpar.algorithms import kernels
from seqpar.errors import require
from seqpar.peers.adapter import AutogradPeer
from seqpar.peers.booking import Hook, equal_alltoall_sends
from seqpar.rules.peers import YunchangUlyssesRules


def sdpa_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0,
                softmax_scale: float | None = None, causal: bool = False,
                **_: Any) -> torch.Tensor:
    """flash_attn_func's call shape (bshd) on torch's SDPA: the kernel in yunchang's slot."""
    require(dropout_p == 0.0, "dropout_p", dropout_p, "the SDPA slot takes no dropout")
    group = q.shape[2] // k.shape[2]
    if group > 1:  # one K,V head per query head, as seqpar's torch backend expands them
        k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         is_causal=causal, scale=softmax_scale)
    return out.transpose(1, 2)


def uses_flash(backend: str, device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """Whether yunchang's own flash-attn kernel runs (backend auto or flash, where it can)."""
    if backend not in ("auto", "flash"):
        return False
    return kernels.resolve_backend(backend, device, dtype, head_dim=head_dim) == "flash"


class YunchangUlysses(YunchangUlyssesRules, AutogradPeer):
    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._modules: dict[bool, Any] = {}

    def module(self, flash: bool) -> Any:
        if flash not in self._modules:
            from yunchang.kernels import AttnType
            from yunchang.ulysses import UlyssesAttention

            # TORCH_FLASH only builds (its fwd-bwd function is a ring): the slot is replaced
            m = UlyssesAttention(self.comm.group or dist.group.WORLD,
                                 attn_type=AttnType.FA if flash else AttnType.TORCH_FLASH)
            if not flash:
                m.attn_fn = sdpa_kernel
            self._modules[flash] = m
        return self._modules[flash]

    def run(self, q, k, v):
        flash = uses_flash(self.backend, q.device, q.dtype, q.shape[-1])
        return self.module(flash)(q, k, v, softmax_scale=self.scale, causal=self.causal)

    def hooks(self):
        return (Hook(dist, "all_to_all_single", "all_to_all", equal_alltoall_sends),)
