"""The token-wise pieces of a decoder block: the RMSNorms (LLaMA's, Gemma's), rotary embeddings at
global positions (any frequencies, a rotary fraction), the gated feed-forward unit.

Every function here acts on each token independently, which is what lets the checkpointing modes
split a shard's tokens into a recomputed and a stored part (`checkpointing.py`) exactly.
"""

from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last dimension."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def offset_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma's RMSNorm: normalised and scaled by (1 + weight) in at least float32, then cast back
    (the reference rounds once, after the scale; the weight is stored as w, used as 1 + w)."""
    acc = torch.promote_types(x.dtype, torch.float32)
    y = x.to(acc)
    y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps)
    return (y * (1.0 + weight.to(acc))).to(x.dtype)


def norm(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: bool) -> torch.Tensor:
    """The family's RMSNorm: `offset_rms_norm` where `offset` (Gemma), else `rms_norm`."""
    return offset_rms_norm(x, weight, eps) if offset else rms_norm(x, weight, eps)


def rotary_tables(pos: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype,
                  factor: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin of shape (1, s, 1, 2 * len(inv_freq)) for the tokens at global
    positions `pos` (float64 math; `factor` multiplies both, YaRN's attention factor): the second
    is sin with its first half negated, the sign rotate-half gives (`apply_rope`), folded in once
    a step rather than negating x in every layer.

    Computed from the positions themselves, so a zigzag or stripe shard rotates each token by the
    angle of its place in the whole sequence, as the one-process model does.
    """
    angles = pos.to(torch.float64)[:, None] * inv_freq.to(pos.device, torch.float64)[None, :]
    sin = angles.sin()
    signed = torch.cat([-sin, sin], dim=-1)
    cos = torch.cat([angles, angles], dim=-1).cos()
    if factor != 1.0:
        cos, signed = cos * factor, signed * factor
    return cos.to(dtype)[None, :, None, :], signed.to(dtype)[None, :, None, :]


def rope_tables(pos: torch.Tensor, head_dim: int, theta: float,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """`rotary_tables` of default RoPE at base `theta` over the whole head (torch's pow: the
    textbook form the rotate-half test holds `apply_rope` to)."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    return rotary_tables(pos, inv_freq, dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (batch, s, heads, head_dim) by the tables of `rotary_tables` (rotate-half
    convention: x * cos + [-x2, x1] * sin, here [x2, x1] * signed sin: the same products, as
    (-a) b = a (-b) exactly, in one roll instead of a negation and a concatenation, forward and
    backward). Tables narrower than the head turn its first dimensions only and pass the rest
    (partial rotary: rotate-half within the rotated part, as the reference does)."""
    d = cos.shape[-1]
    if d == x.shape[-1]:
        return x * cos + x.roll(d // 2, dims=-1) * sin
    turned = x[..., :d]
    return torch.cat([turned * cos + turned.roll(d // 2, dims=-1) * sin, x[..., d:]], dim=-1)


OAI_ALPHA = 1.702  # gpt-oss's clamped SwiGLU: gate * sigmoid(alpha * gate)


def glu(gate: torch.Tensor, up: torch.Tensor, act: str, limit: float = 0.0) -> torch.Tensor:
    """A gated unit of the feed-forward (dense and expert alike), `act` as `ModelConfig.act`:
    silu (SwiGLU), gelu_tanh (Gemma's GeGLU) or swiglu_oai (gpt-oss: gate clamped above at
    `limit`, up to [-limit, limit], gate * sigmoid(1.702 gate) * (up + 1))."""
    if act == "silu":
        return torch.nn.functional.silu(gate) * up
    if act == "gelu_tanh":
        return torch.nn.functional.gelu(gate, approximate="tanh") * up
    if act == "swiglu_oai":
        gate, up = gate.clamp(max=limit), up.clamp(min=-limit, max=limit)
        return gate * torch.sigmoid(gate * OAI_ALPHA) * (up + 1)
    raise ValueError(f"act={act!r}: not one of silu, gelu_tanh, swiglu_oai")


def swiglu(x: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """W2 (silu(W1 x) * W3 x)."""
    return torch.nn.functional.linear(
        torch.nn.functional.silu(torch.nn.functional.linear(x, w1))
        * torch.nn.functional.linear(x, w3), w2)
