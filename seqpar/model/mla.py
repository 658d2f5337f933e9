"""Multi-head latent attention's token-wise part (DeepSeek-V2/V3, Kimi K2), as transformers'
`DeepseekV3Attention` computes it:

    q = W_qb norm(W_qa h)  (or W_q h)          -> per head [q_nope, q_rope], q_rope turned
    [c, k_rope] = W_kva h;  c = norm(c)        -> k_rope turned, one head every head shares
    [k_nope, v] = W_kvb c per head (`algorithms.latent.up_project`); k = [k_nope, k_rope]

then the attention (any SP algorithm) with query/key width head_dim = nope + rope and value width
v_head_dim, and W_o. With `rope_interleave` (DeepSeek-V3's checkpoints) the RoPE dimensions come in
interleaved pairs (x0, x1), (x2, x3), ...: they are de-interleaved, then turned as halves, which is
the reference's arithmetic exactly. `pre(..., latent=True)` stops before the up-projection and
hands the attention (q, c, k_rope): the latent pass of the ring family rebuilds K,V itself.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from seqpar.algorithms import Attention
from seqpar.algorithms.latent import LatentAttention, up_project
from seqpar.model.layers import apply_rope, rms_norm
from seqpar.rules.model import ModelConfig

# the latent norms' eps: the reference builds q_a_layernorm and kv_a_layernorm with its RMSNorm's
# default, not the config's rms_norm_eps
MLA_NORM_EPS = 1e-6

Params = Callable[[str], torch.Tensor | None]


def rope_width(cfg: ModelConfig) -> int:
    """The dimensions a query or key head turns by RoPE: the shared RoPE key's under MLA."""
    return cfg.qk_rope_dim if cfg.mla else cfg.head_dim


def turn(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool) -> torch.Tensor:
    """x (bshd) turned by RoPE tables (`layers.rotary_tables`); interleaved pairs first laid out
    as halves (the reference's `apply_rotary_pos_emb_interleave` returns them so)."""
    if interleave:
        x = torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)
    return apply_rope(x, cos, sin)


def queries(h: torch.Tensor, p: Params, cfg: ModelConfig, cos: torch.Tensor,
            sin: torch.Tensor) -> torch.Tensor:
    """Every head's query (B, s, H, nope + rope) of normed hidden states h, its RoPE part turned."""
    b, s, _ = h.shape
    if cfg.q_lora_rank:
        q = F.linear(rms_norm(F.linear(h, p("wq_a")), p("q_a_norm"), MLA_NORM_EPS), p("wq_b"))
    else:
        q = F.linear(h, p("wq"))
    q = q.view(b, s, cfg.heads, cfg.head_dim)
    nope = cfg.head_dim - cfg.qk_rope_dim
    q_nope, q_rope = q.split((nope, cfg.qk_rope_dim), dim=-1)
    return torch.cat([q_nope, turn(q_rope, cos, sin, cfg.rope_interleave)], dim=-1)


def latents(h: torch.Tensor, p: Params, cfg: ModelConfig, cos: torch.Tensor,
            sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(c (B, s, 1, kv_lora_rank) normed, k_rope (B, s, 1, rope) turned) of normed h."""
    b, s, _ = h.shape
    c, k_rope = F.linear(h, p("wkv_a")).split((cfg.kv_lora_rank, cfg.qk_rope_dim), dim=-1)
    c = rms_norm(c, p("kv_a_norm"), MLA_NORM_EPS).view(b, s, 1, cfg.kv_lora_rank)
    return c, turn(k_rope.view(b, s, 1, cfg.qk_rope_dim), cos, sin, cfg.rope_interleave)


def pre(h: torch.Tensor, p: Params, cfg: ModelConfig, cos: torch.Tensor, sin: torch.Tensor,
        latent: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, k, v) the attention takes from normed h; with `latent`, (q, c, k_rope) for an attention
    that rebuilds K,V itself (`algorithms.latent`)."""
    q = queries(h, p, cfg, cos, sin)
    c, k_rope = latents(h, p, cfg, cos, sin)
    if latent:
        return q, c, k_rope
    k, v = up_project(torch.cat([c, k_rope], dim=-1), p("wkv_b"), cfg.heads, cfg.v_head_dim)
    return q, k, v


def carrying(attention: Attention, mla_pass: str) -> Attention:
    """A layer's attention as its model's mla_pass has it: as built ('kv'), or carrying the
    latent ('latent': `LatentAttention`; `rules.algorithms.check_mla_pass` said where)."""
    return LatentAttention(attention) if mla_pass == "latent" else attention


def bind(block: Any, attend: Callable) -> tuple[Callable, Callable]:
    """(pre, attend) of an MLA block's call (`model.block.Block`): as they are, or where the
    attention carries the latent, the pre that stops before the up-projection and the attention
    bound to the layer's wkv_b."""
    if not isinstance(getattr(attend, "func", attend), LatentAttention):
        return block.pre, attend

    def latent_pre(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        return pre(block.norm(x, "attn_norm"), block.opt, block.cfg, cos, sin, latent=True)

    return latent_pre, functools.partial(attend, wkv_b=block.opt("wkv_b"))
