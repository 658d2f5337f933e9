"""Multi-head latent attention's keys and values (DeepSeek-V2/V3, Kimi K2): rebuilt per head from
a token's latent, the one place this up-projection lives (the model's MLA layer and the latent
ring both call it).

A token keeps `latent` = [c, k_rope] (bshd, one head): c the normed kv_lora_rank latent, k_rope
the qk_rope_dim RoPE key every head shares. `wkv_b` (heads * (nope + v_dim), kv_lora_rank) turns c
into each head's [k_nope, v]; a head's key is [k_nope, k_rope], its value v (as transformers'
`DeepseekV3Attention.expand_kv`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def latent_width(wkv_b: torch.Tensor) -> int:
    """kv_lora_rank: the latent's own values (the rest of a latent row is the RoPE key)."""
    return wkv_b.shape[1]


def up_project(latent: torch.Tensor, wkv_b: torch.Tensor, heads: int, v_dim: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """(K (B, s, H, nope + rope), V (B, s, H, v_dim)) of tokens' latents (B, s, 1, r + rope)."""
    b, s = latent.shape[:2]
    r = latent_width(wkv_b)
    c, k_rope = latent.split((r, latent.shape[-1] - r), dim=-1)
    kv = F.linear(c.reshape(b, s, r), wkv_b).view(b, s, heads, -1)
    k_nope, v = kv.split((kv.shape[-1] - v_dim, v_dim), dim=-1)
    k = torch.cat([k_nope, k_rope.expand(b, s, heads, k_rope.shape[-1])], dim=-1)
    return k, v.contiguous()
