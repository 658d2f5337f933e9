"""FLOP counts, once: attention blocks, a decoder's GEMMs, a training step and its recompute.

One convention for attention blocks: forward `4·B·Sq·Sk·H·D` (two matmuls, QKᵀ and PV), halved for
a causal or shifted block, a band block counting its visible pairs; backward `BACKWARD_FLOPS` =
2.5x forward. 2.5 is the work a fused kernel does: its backward runs five matmuls (it recomputes QKᵀ,
then dV, dP, dQ, dK) against the forward's two (FlashAttention-2 §3 and its benchmark's count;
MagiAttention's), so it is the count a kernel's measured TFLOP/s refers to and the one kernel time
is predicted from. The model's count leaves the recomputed QKᵀ out: `MODEL_BACKWARD_FLOPS` = (5 -
1) / 2 = 2, the "2x" of the dense-layer convention (Megatron-LM, torchtitan).

GEMMs (projections, SwiGLU, LM head) are exact: backward = 2x forward (dX and dW).

A training step's utilisation, three conventions, each named for what it counts (`CONVENTIONS`;
the planner, the runner and MLflow use these names):
- `mfu`: model FLOPs the step really does, over the peak: 6·dense params·tokens (a mixture of
  experts' active ones: the router, the k experts a token is sent to, the shared ones; a tied
  embedding's matrix once, as the head) + 3·the attention's forward by its area (causal: N²/2
  pairs; a sliding-window layer its band's; any mask: its visible pairs; packed documents: each
  document's), no recompute counted (neither activation checkpointing nor the kernel's QKᵀ).
  Megatron-LM's formula (`num_floating_point_operations`) with attention by area: LoongTrain §6.1
  ("the FLOPs for attention are halved") and BurstEngine's (its `causal_tflops`) count so.
- `mfu_unmasked_attention`: torchtitan's (`get_num_flop_per_token`: 6·params + 12·L·d·N a token)
  and Megatron-LM's default: attention counted as if unmasked. It passes the hardware's peak at
  long causal sequences (it counts work a causal kernel skips).
- `hfu`: hardware FLOPs (PaLM's HFU): what the kernels run, the fused attention backward at 2.5x and
  every FLOP activation checkpointing recomputes included.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from seqpar.rules.counts import LayerClass, gemms, layer_classes, matmul_params
from seqpar.rules.linear import LinearShape, delta_rule_flops
from seqpar.rules.model import ModelConfig

FORWARD_MATMULS = 2     # QKᵀ, PV
BACKWARD_MATMULS = 5    # QKᵀ again, dV = PᵀdO, dP = dO Vᵀ, dQ = dS K, dK = dSᵀ Q
RECOMPUTED_MATMULS = 1  # the QKᵀ a fused backward recomputes
BACKWARD_FLOPS = BACKWARD_MATMULS / FORWARD_MATMULS                                 # 2.5
MODEL_BACKWARD_FLOPS = (BACKWARD_MATMULS - RECOMPUTED_MATMULS) / FORWARD_MATMULS    # 2.0

CONVENTIONS = ("mfu", "mfu_unmasked_attention", "hfu")


def flop_width(head_dim: float, v_dim: float | None = None) -> float:
    """The D that `attention_flops` counts a block at: QKᵀ runs at the query/key width and PV at
    the value width, so with a V head dim of its own (MLA) D is their mean."""
    return head_dim if v_dim is None or v_dim == head_dim else (head_dim + v_dim) / 2


def attention_flops(batch: int, sq: int, sk: int, heads: int, head_dim: float, mask: str,
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
def per_layer(cfg: ModelConfig, of: Callable[[LayerClass], float]) -> float:
    """The mean over the model's layers of a count taken per class of alike layers
    (`rules.counts.layer_classes`); a model whose layers are alike: the count itself."""
    classes = layer_classes(cfg)
    if len(classes) == 1:
        return of(classes[0])
    return sum(c.count * of(c) for c in classes) / cfg.layers


@lru_cache(maxsize=256)
def dense_params(cfg: ModelConfig) -> int:
    """Parameters one token's matrix products use (6 FLOPs each a trained token): the active
    parameters but the embedding table (a lookup); a tied embedding's matrix still runs the head."""
    return cfg.active_params() - (0 if cfg.tie_embeddings else cfg.vocab * cfg.hidden)


@lru_cache(maxsize=256)
def block_params(cfg: ModelConfig) -> float:
    """A block's matrix parameters one token runs through (q, k, v, o and the feed-forward: dense,
    or the router, k routed experts and the shared ones; not norms or biases), on average over
    the layers."""
    return per_layer(cfg, lambda c: matmul_params(cfg, c.first))


def gemm_flops(cfg: ModelConfig, tokens: float) -> float:
    """Forward FLOPs of one block's GEMMs for `tokens` tokens: 2·tokens·(block's matrix params)."""
    return 2.0 * tokens * block_params(cfg)


def mlp_flops(cfg: ModelConfig, tokens: float) -> float:
    """Forward FLOPs of one block's feed-forward for `tokens` tokens (on average over layers)."""
    return 2.0 * tokens * per_layer(cfg, lambda c: sum(g.per_token for g in gemms(cfg, c.first)
                                                         if g.mlp))


def qkv_flops(cfg: ModelConfig, tokens: float) -> float:
    """Forward FLOPs of one block's q, k, v projections for `tokens` tokens."""
    return 2.0 * tokens * cfg.hidden * ((cfg.heads + 2 * cfg.kv_heads) * cfg.head_dim)


def head_flops(cfg: ModelConfig, tokens: float) -> float:
    """Forward FLOPs of the LM head for `tokens` tokens (tied or not: the head's matrix runs)."""
    return 2.0 * tokens * cfg.hidden * cfg.vocab


def causal_pairs(seq_len: int) -> float:
    """Visible (query, key) pairs of causal attention as the conventions count them: N²/2 (a
    kernel's causal blocks over any balanced layout count exactly this)."""
    return seq_len * seq_len / 2


def window_pairs(seq_len: int, window: int) -> float:
    """Visible pairs of a causal sliding window of `window` keys over seq_len tokens (query t sees
    t-W+1..t); the causal count N²/2 where the window holds the whole sequence."""
    if window >= seq_len:
        return causal_pairs(seq_len)
    return float(band_pairs(seq_len, seq_len, (1 - window, 1)))


def pair_width(cfg: ModelConfig) -> float:
    """A visible pair's FLOPs over 4 a head (`flop_width`: MLA's (192 + 128) / 2)."""
    return flop_width(cfg.head_dim, cfg.v_head_dim or None)


def softmax_share(cfg: ModelConfig) -> float:
    """The share of the layers that run softmax attention (a linear layer sees no pairs)."""
    return per_layer(cfg, lambda c: 0.0 if c.kind == "linear" else 1.0)


def model_pairs(cfg: ModelConfig, seq_len: int) -> float:
    """Visible pairs a layer of the model's own attention sees, on average over its layers: a full
    layer causal (N²/2), a sliding layer its window's band, a linear layer none."""
    each = {"full": causal_pairs(seq_len), "linear": 0.0}  # a linear layer sees no pairs
    return per_layer(cfg, lambda c: each[c.kind] if c.kind in each
                     else window_pairs(seq_len, cfg.window))


def step_flops(cfg: ModelConfig, batch: int, seq_len: int, pairs: float | None = None,
               backward: float = MODEL_BACKWARD_FLOPS) -> float:
    """FLOPs of one forward + backward over batch sequences of seq_len tokens (all ranks together,
    no recompute): 6·dense params·tokens + (1 + backward)·the attention's forward over `pairs`
    visible (query, key) pairs a sequence and layer, on average over the layers (default the
    model's own: causal N²/2 a full layer, a window's band a sliding one; N² counts it unmasked),
    and each linear layer's chunked delta rule. The default `backward` is the model's 2x (`mfu`);
    BACKWARD_FLOPS gives what the kernels run."""
    pairs = model_pairs(cfg, seq_len) if pairs is None else pairs
    attn = cfg.layers * 4.0 * batch * pairs * cfg.heads * pair_width(cfg)
    out = 6.0 * dense_params(cfg) * batch * seq_len + (1.0 + backward) * attn
    linear = cfg.layer_types.count("linear")
    if linear:  # the linear layers' chunked rule (one pass over the whole sequence)
        out += (1.0 + backward) * linear * delta_rule_flops(LinearShape.of(cfg, batch, 2),
                                                              seq_len)
    return out


def attention_model_flops(backward_kernel_flops: float) -> float:
    """The attention's model FLOPs (forward + 2x backward, by area) from what its backward kernels
    ran (the ledger's backward phase: 2.5x the forward by area; a backward is never recomputed)."""
    return backward_kernel_flops * (1.0 + MODEL_BACKWARD_FLOPS) / BACKWARD_FLOPS


def visible_pairs(backward_kernel_flops: float, cfg: ModelConfig, sequences: int) -> float:
    """Visible (query, key) pairs a sequence from what a step's attention backward kernels ran,
    all ranks together (2.5x the forward by area, every layer once)."""
    per_pair = BACKWARD_FLOPS * 4.0 * cfg.heads * pair_width(cfg) * cfg.layers * sequences
    return backward_kernel_flops / per_pair


def conventions(cfg: ModelConfig, batch: int, seq_len: int, pairs: float | None = None,
                recomputed: float = 0.0) -> dict[str, float]:
    """FLOPs of one step of batch sequences under each of `CONVENTIONS` (see the module
    docstring); `recomputed`: the FLOPs checkpointing recomputes, all ranks together (hfu)."""
    return {"mfu": step_flops(cfg, batch, seq_len, pairs),
            "mfu_unmasked_attention": step_flops(cfg, batch, seq_len,
                                                 float(seq_len) ** 2 * softmax_share(cfg)),
            "hfu": step_flops(cfg, batch, seq_len, pairs, BACKWARD_FLOPS) + recomputed}


def recomputed_tokens(mode: str, fraction: float, s: int) -> int:
    """How many of the shard's first tokens have their token-wise activations recomputed under a
    checkpoint mode (none, full, sc++, sequence, sc++,sequence, seq-attn). seq-attn recomputes the
    whole block (and the attention of the first `fraction` of the tokens, `recomputed_flops`)."""
    if mode == "none":
        return 0
    if mode in ("sc++", "full", "seq-attn"):
        return s
    return int(round(fraction * s))


def recomputed_flops(cfg: ModelConfig, batch: int, seq_len: int, world: int, mode: str,
                     fraction: float, pairs: float | None = None) -> float:
    """FLOPs one rank recomputes in backward under a checkpointing mode; the attention's forward
    over `pairs` visible pairs a sequence and layer (default the model's own, `model_pairs`)
    spread evenly over the ranks. seq-attn re-runs it for the prefix of F·N tokens only: F² of a
    causal forward's pairs."""
    s = seq_len // world
    m = recomputed_tokens(mode, fraction, s)
    dense = gemm_flops(cfg, batch * m)
    qkv = qkv_flops(cfg, batch * s)
    pairs = model_pairs(cfg, seq_len) if pairs is None else pairs

    def attention(share: float) -> float:
        return 4.0 * batch * pairs * share * cfg.heads * pair_width(cfg) / world

    per_layer = {"none": 0.0, "sequence": dense, "sc++": dense + qkv, "sc++,sequence": dense + qkv,
                 "full": dense + attention(1.0),
                 "seq-attn": dense + attention(fraction * fraction)}[mode]
    return cfg.layers * per_layer
