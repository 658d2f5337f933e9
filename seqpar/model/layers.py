"""The token-wise pieces of a LLaMA block: RMSNorm, rotary embeddings at global positions, SwiGLU.

Every function here acts on each token independently, which is what lets the checkpointing modes
split a shard's tokens into a recomputed and a stored part (`checkpointing.py`) exactly.
"""

from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last dimension."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope_tables(pos: torch.Tensor, head_dim: int, theta: float,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin of shape (1, s, 1, head_dim) for the tokens at global positions `pos`
    (float64 math): the second is sin with its first half negated, the sign rotate-half gives
    (`apply_rope`), folded in once a step rather than negating x in every layer.

    Computed from the positions themselves, so a zigzag or stripe shard rotates each token by the
    angle of its place in the whole sequence, as the one-process model does.
    """
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device=pos.device)
                         / head_dim)
    angles = pos.to(torch.float64)[:, None] * inv_freq[None, :]
    sin = angles.sin()
    signed = torch.cat([-sin, sin], dim=-1)
    return (torch.cat([angles, angles], dim=-1).cos().to(dtype)[None, :, None, :],
            signed.to(dtype)[None, :, None, :])


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (batch, s, heads, head_dim) by the tables of `rope_tables` (rotate-half convention:
    x * cos + [-x2, x1] * sin, here [x2, x1] * signed sin: the same products, as (-a) b = a (-b)
    exactly, in one roll instead of a negation and a concatenation, forward and backward)."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin


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
