"""Every parameter of a `ModelConfig`'s decoder by name and shape: the one list the torch model
creates, the loader maps to a checkpoint's tensors and the planner counts.

A layer is its token mixer (softmax attention — plain, or multi-head latent — or a linear-attention
layer) and its feed-forward (dense, or a mixture of experts); `layer_shapes(cfg, i)` lists layer i's
in the order they are created (and drawn from the seed). Pure Python.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

Shapes = dict[str, tuple[int, ...]]
ModelConfig = Any  # rules.model.ModelConfig, which imports this module (no import back: no cycle)


def numel(shape: tuple[int, ...]) -> int:
    out = 1
    for n in shape:
        out *= n
    return out


def _softmax(cfg: ModelConfig) -> Shapes:
    d, hd = cfg.hidden, cfg.head_dim
    q, kv = cfg.heads * hd, cfg.kv_heads * hd
    out: Shapes = {"wq": ((2 if cfg.attn_gate else 1) * q, d), "wk": (kv, d), "wv": (kv, d),
                   "wo": (d, q)}
    if cfg.qkv_bias:
        out.update(bq=(out["wq"][0],), bk=(kv,), bv=(kv,))
    if cfg.o_bias:
        out["bo"] = (d,)
    if cfg.qk_norm:
        out.update(q_norm=(hd,), k_norm=(hd,))
    if cfg.sinks:
        out["sinks"] = (cfg.heads,)
    return out


def _latent(cfg: ModelConfig) -> Shapes:
    """Multi-head latent attention: q through an optional low-rank bottleneck; K,V rebuilt from a
    kv_lora_rank latent (normed) by wkv_b, beside one qk_rope_dim RoPE key every head shares."""
    d, h, hd = cfg.hidden, cfg.heads, cfg.head_dim
    nope = hd - cfg.qk_rope_dim
    out: Shapes = {}
    if cfg.q_lora_rank:
        out.update(wq_a=(cfg.q_lora_rank, d), q_a_norm=(cfg.q_lora_rank,),
                   wq_b=(h * hd, cfg.q_lora_rank))
    else:
        out["wq"] = (h * hd, d)
    out.update(wkv_a=(cfg.kv_lora_rank + cfg.qk_rope_dim, d), kv_a_norm=(cfg.kv_lora_rank,),
               wkv_b=(h * (nope + cfg.v_head_dim), cfg.kv_lora_rank),
               wo=(d, h * cfg.v_head_dim))
    return out


def _linear(cfg: ModelConfig) -> Shapes:
    """A gated DeltaNet layer (Qwen3-Next): q, k, v, z and the b, a gates in two projections, the
    short convolution over q, k, v, per value head a decay (A_log, dt_bias), a gated norm, out."""
    d = cfg.hidden
    kdim, vdim = cfg.lin_k_heads * cfg.lin_k_dim, cfg.lin_v_heads * cfg.lin_v_dim
    return {"lin_qkvz": (2 * kdim + 2 * vdim, d), "lin_ba": (2 * cfg.lin_v_heads, d),
            "lin_conv": (2 * kdim + vdim, 1, cfg.conv_kernel), "lin_dt_bias": (cfg.lin_v_heads,),
            "lin_a_log": (cfg.lin_v_heads,), "lin_norm": (cfg.lin_v_dim,), "lin_out": (d, vdim)}


def attention_shapes(cfg: ModelConfig, layer: int = 0) -> Shapes:
    """Layer `layer`'s norms and token mixer, in creation order."""
    d = cfg.hidden
    out: Shapes = {"attn_norm": (d,), "ffn_norm": (d,)}
    if cfg.sandwich_norms:
        out.update(post_attn_norm=(d,), post_ffn_norm=(d,))
    if cfg.layer_types[layer] == "linear":
        out.update(_linear(cfg))
    elif cfg.kv_lora_rank:
        out.update(_latent(cfg))
    else:
        out.update(_softmax(cfg))
    return out


def ffn_shapes(cfg: ModelConfig, moe: bool) -> Shapes:
    """One layer's feed-forward: a dense gated unit, or the router, the routed experts (stacked:
    expert first) and the shared experts."""
    d = cfg.hidden
    if not moe:
        f = cfg.ffn
        out = {"w1": (f, d), "w3": (f, d), "w2": (d, f)}
        if cfg.mlp_bias:
            out.update(b1=(f,), b3=(f,), b2=(d,))
        return out
    e, f = cfg.experts, cfg.moe_ffn
    out = {"router": (e, d)}
    if cfg.router_bias:
        out["router_bias"] = (e,)
    if cfg.router == "sigmoid_group":  # DeepSeek's e_score_correction_bias: picks, never weighs
        out["router_score_bias"] = (e,)
    out.update(experts_w1=(e, f, d), experts_w3=(e, f, d), experts_w2=(e, d, f))
    if cfg.expert_bias:
        out.update(experts_b1=(e, f), experts_b3=(e, f), experts_b2=(e, d))
    if cfg.shared_ffn:
        s = cfg.shared_ffn
        out.update(shared_w1=(s, d), shared_w3=(s, d), shared_w2=(d, s))
        if cfg.shared_gate:
            out["shared_gate"] = (1, d)
    return out


def layer_shapes(cfg: ModelConfig, layer: int) -> Shapes:
    """Layer `layer`'s parameters, in the order they are created (and drawn from the seed)."""
    return {**attention_shapes(cfg, layer), **ffn_shapes(cfg, cfg.is_moe(layer))}


def block_shapes(cfg: ModelConfig) -> Shapes:
    """The first layer's parameters (every layer's, in a model whose layers are alike)."""
    return layer_shapes(cfg, 0)


def expert_numel(cfg: ModelConfig) -> int:
    """One routed expert's parameters."""
    per = 3 * cfg.moe_ffn * cfg.hidden
    return per + (2 * cfg.moe_ffn + cfg.hidden if cfg.expert_bias else 0)


def param_shapes(cfg: ModelConfig) -> Shapes:
    """Every parameter of the decoder by name (the embedding, each layer's, the final norm, the
    head unless tied)."""
    out: Shapes = {"embed": (cfg.vocab, cfg.hidden)}
    for i in range(cfg.layers):
        out.update({f"blocks.{i}.{k}": s for k, s in layer_shapes(cfg, i).items()})
    out["norm"] = (cfg.hidden,)
    if not cfg.tie_embeddings:
        out["head"] = (cfg.vocab, cfg.hidden)
    return out


@lru_cache(maxsize=256)
def block_numel(cfg: ModelConfig) -> int:
    """Parameters of one block, on average over the layers (a mixed model's layers differ)."""
    total = sum(numel(s) for i in range(cfg.layers) for s in layer_shapes(cfg, i).values())
    return total // cfg.layers
