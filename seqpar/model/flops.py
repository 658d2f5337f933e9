"""Model FLOPs of a training step (for MFU) and the FLOPs each checkpointing mode recomputes.

Two conventions, both reported and tagged: `halved` (the papers': 6 x dense params x tokens plus
attention with the causal half skipped) and `full` (attention counted as if unmasked). Attention's
forward count is `kernels.attention_flops`; a training step is 3x forward (backward = 2x).
"""

from __future__ import annotations

from seqpar.algorithms.kernels import attention_flops
from seqpar.model import checkpointing
from seqpar.model.config import ModelConfig

CONVENTIONS = ("halved", "full")


def dense_params(cfg: ModelConfig) -> int:
    """Parameters that take part in matrix products (all but the embedding table)."""
    return cfg.params() - cfg.vocab * cfg.hidden


def block_params(cfg: ModelConfig) -> int:
    kv = cfg.kv_heads * cfg.head_dim
    return cfg.hidden * (2 * cfg.hidden + 2 * kv) + 3 * cfg.hidden * cfg.ffn


def step_flops(cfg: ModelConfig, batch: int, seq_len: int, convention: str = "halved") -> float:
    """Model FLOPs of one forward + backward over batch x seq_len tokens (all ranks together)."""
    mask = "causal" if convention == "halved" else "full"
    attn = cfg.layers * attention_flops(batch, seq_len, seq_len, cfg.heads, cfg.head_dim, mask)
    return 6.0 * dense_params(cfg) * batch * seq_len + 3.0 * attn


def recomputed_flops(cfg: ModelConfig, batch: int, seq_len: int, world: int, mode: str,
                     fraction: float) -> float:
    """FLOPs one rank recomputes in backward under a checkpointing mode (causal attention)."""
    s = seq_len // world
    m = checkpointing.recomputed_tokens(mode, fraction, s)
    dense = 2.0 * block_params(cfg) * batch * m
    qkv = 2.0 * cfg.hidden * (cfg.hidden + 2 * cfg.kv_heads * cfg.head_dim) * batch * s
    per_layer = {"none": 0.0, "sequence": dense, "sc++": dense + qkv, "sc++,sequence": dense + qkv,
                 "full": dense + attention_flops(batch, seq_len, seq_len, cfg.heads, cfg.head_dim,
                                                 "causal") / world}[mode]
    return cfg.layers * per_layer
