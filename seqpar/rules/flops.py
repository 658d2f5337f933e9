"""FLOP counts, once: attention blocks, a decoder's GEMMs, a training step and its recompute.

One convention for attention: forward `4·B·Sq·Sk·H·D` (two matmuls, QKᵀ and PV), halved for a
causal or shifted block, a band block counting its visible pairs; backward `BACKWARD_FLOPS` = 2.5x
forward. 2.5 is the work a fused kernel does: its backward runs five matmuls (it recomputes QKᵀ,
then dV, dP, dQ, dK) against the forward's two (FlashAttention-2 §3 and its benchmark's count;
ALGORITHMS.md; LoongTrain §6.1 and MagiAttention count MFU this way), so it is the count a kernel's
measured TFLOP/s refers to and the one kernel time is predicted from. The "2x" of the dense-layer
convention (Megatron-LM, torchtitan: 6·params·tokens + 12·L·H·N per token) is derived, not kept
apart: `MODEL_BACKWARD_FLOPS` = the backward's matmuls without the recomputed QKᵀ, over the
forward's = (5 - 1) / 2 = 2.

GEMMs (projections, SwiGLU, LM head) are exact: backward = 2x forward (dX and dW).
A training step's model FLOPs, two conventions (both reported): `halved`, the papers' (LoongTrain
§6.1: causal attention counts its visible half, backward 2.5x) and `full`, Megatron-LM's and
torchtitan's (6·params + 12·L·d·N a token: attention as if unmasked, backward 2x). `full` can pass
the hardware's peak at long causal sequences: it counts work a causal kernel skips.
"""

from __future__ import annotations

from seqpar.rules.model import ModelConfig, block_numel

FORWARD_MATMULS = 2     # QKᵀ, PV
BACKWARD_MATMULS = 5    # QKᵀ again, dV = PᵀdO, dP = dO Vᵀ, dQ = dS K, dK = dSᵀ Q
RECOMPUTED_MATMULS = 1  # the QKᵀ a fused backward recomputes
BACKWARD_FLOPS = BACKWARD_MATMULS / FORWARD_MATMULS                                 # 2.5
MODEL_BACKWARD_FLOPS = (BACKWARD_MATMULS - RECOMPUTED_MATMULS) / FORWARD_MATMULS    # 2.0

CONVENTIONS = ("halved", "full")


def attention_flops(batch: int, sq: int, sk: int, heads: int, head_dim: int, mask: str,
                    band: tuple[int, int] | None = None) -> float:
    """Forward FLOPs of one attention block: 4·B·Sq·Sk·H·D, halved for a causal or shifted block;
    a band block counts its visible pairs (backward: BACKWARD_FLOPS x this)."""
    if mask == "band":
        assert band is not None
        return 4.0 * batch * band_pairs(sq, sk, band) * heads * head_dim
    full = 4.0 * batch * sq * sk * heads * head_dim
    return full if mask == "full" else full / 2


def band_pairs(sq: int, sk: int, band: tuple[int, int]) -> int:
    """Visible (i, j) pairs of a band block: 0 <= i < sq, 0 <= j < sk and band[0] <= j - i <
    band[1], in closed form (row i sees clamp(i + b, 0, sk) - clamp(i + a, 0, sk) keys)."""
    def below(c: int) -> int:  # sum over rows of clamp(i + c, 0, sk): pairs with j - i < c
        return _clamp_sum(c + sq - 1, sk) - _clamp_sum(c - 1, sk)

    return max(0, below(band[1]) - below(band[0]))


def _clamp_sum(x: int, sk: int) -> int:
    """sum of clamp(t, 0, sk) over integers t <= x."""
    if x <= 0:
        return 0
    m = min(x, sk)
    return m * (m + 1) // 2 + (x - m) * sk


# ------------------------------------------------------------------------------ the decoder
def dense_params(cfg: ModelConfig) -> int:
    """Parameters that take part in matrix products (all but the embedding table)."""
    return cfg.params() - cfg.vocab * cfg.hidden


def block_params(cfg: ModelConfig) -> int:
    """A block's matrix parameters (q, k, v, o projections and SwiGLU; not its norms)."""
    return block_numel(cfg) - 2 * cfg.hidden


def gemm_flops(cfg: ModelConfig, tokens: float) -> float:
    """Forward FLOPs of one block's GEMMs for `tokens` tokens: 2·tokens·(block's matrix params)."""
    return 2.0 * tokens * block_params(cfg)


def mlp_flops(cfg: ModelConfig, tokens: float) -> float:
    """Forward FLOPs of one block's SwiGLU (w1, w3, w2) for `tokens` tokens."""
    return 2.0 * tokens * 3 * cfg.hidden * cfg.ffn


def qkv_flops(cfg: ModelConfig, tokens: float) -> float:
    """Forward FLOPs of one block's q, k, v projections for `tokens` tokens."""
    return 2.0 * tokens * cfg.hidden * (cfg.hidden + 2 * cfg.kv_heads * cfg.head_dim)


def head_flops(cfg: ModelConfig, tokens: float) -> float:
    """Forward FLOPs of the LM head for `tokens` tokens."""
    return 2.0 * tokens * cfg.hidden * cfg.vocab


def step_flops(cfg: ModelConfig, batch: int, seq_len: int, convention: str = "halved") -> float:
    """Model FLOPs of one forward + backward over batch x seq_len tokens (all ranks together, no
    recompute): 6·dense params·tokens + (1 + backward)·attention forward, by `convention`."""
    halved = convention == "halved"
    backward = BACKWARD_FLOPS if halved else MODEL_BACKWARD_FLOPS
    attn = cfg.layers * attention_flops(batch, seq_len, seq_len, cfg.heads, cfg.head_dim,
                                        "causal" if halved else "full")
    return 6.0 * dense_params(cfg) * batch * seq_len + (1.0 + backward) * attn


def recomputed_tokens(mode: str, fraction: float, s: int) -> int:
    """How many of the shard's first tokens have their token-wise activations recomputed under a
    checkpoint mode (none, full, sc++, sequence, sc++,sequence)."""
    if mode == "none":
        return 0
    if mode in ("sc++", "full"):
        return s
    return int(round(fraction * s))


def recomputed_flops(cfg: ModelConfig, batch: int, seq_len: int, world: int, mode: str,
                     fraction: float) -> float:
    """FLOPs one rank recomputes in backward under a checkpointing mode (causal attention)."""
    s = seq_len // world
    m = recomputed_tokens(mode, fraction, s)
    dense = gemm_flops(cfg, batch * m)
    qkv = qkv_flops(cfg, batch * s)
    per_layer = {"none": 0.0, "sequence": dense, "sc++": dense + qkv, "sc++,sequence": dense + qkv,
                 "full": dense + attention_flops(batch, seq_len, seq_len, cfg.heads, cfg.head_dim,
                                                 "causal") / world}[mode]
    return cfg.layers * per_layer
