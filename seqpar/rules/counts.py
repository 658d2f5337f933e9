"""Per-layer counts of a decoder whose layers differ: its classes of alike layers (the attention's
kind, a dense or a mixture-of-experts feed-forward), the matrix products one token runs through in
each (the active ones: the router, the k routed experts it is sent to, the shared experts), each
layer's parameters, and the widths its token-wise work and kept activations have.

    for c in layer_classes(cfg):          # (kind, moe, layers), in the order the layers come
        flops = 2 * tokens * matmul_params(cfg, c.first)

What a layer holds is `rules.model.layer_shapes`' (one fact, one place); this module reads it.
Pure Python: the planner counts without torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from seqpar.errors import ConfigError, require
from seqpar.rules.model import ModelConfig, layer_shapes, numel


@dataclass(frozen=True)
class LayerClass:
    """Layers alike in what a step does with them: one attention kind, dense or MoE."""

    kind: str                 # rules.model.LAYER_KINDS
    moe: bool
    layers: tuple[int, ...]   # their indices

    @property
    def count(self) -> int:
        return len(self.layers)

    @property
    def first(self) -> int:
        return self.layers[0]


@dataclass(frozen=True)
class Gemm:
    """One weight's matrix product: `rows` x `cols`, `copies` of it stacked (a layer's routed
    experts), `active` of which one token runs through (k of E routed experts)."""

    name: str
    rows: int
    cols: int
    copies: int = 1
    active: int = 1
    mlp: bool = False         # the feed-forward's (what a tiled MLP recomputes)

    @property
    def share(self) -> float:
        """The fraction of a layer's tokens each copy runs (k/E for a routed expert)."""
        return self.active / self.copies

    @property
    def per_token(self) -> int:
        """Weights one token's forward multiplies by (2 FLOPs each)."""
        return self.active * self.rows * self.cols


KINDS = ("full", "sliding", "linear")  # the token mixers the planner prices


@lru_cache(maxsize=256)
def layer_classes(cfg: ModelConfig) -> tuple[LayerClass, ...]:
    """The model's layers grouped by (kind, moe), in the order of each group's first layer (a
    kind the planner does not price: one line naming it)."""
    odd = [k for k in cfg.layer_types if k not in KINDS]
    require(not odd, "model.layer_types", odd[0] if odd else None,
            f"is a layer kind the planner does not price yet (it prices {', '.join(KINDS)})")
    groups: dict[tuple[str, bool], list[int]] = {}
    for i, kind in enumerate(cfg.layer_types):
        groups.setdefault((kind, cfg.is_moe(i)), []).append(i)
    return tuple(LayerClass(k, m, tuple(ls)) for (k, m), ls in groups.items())


# softmax attention's projections, multi-head latent attention's (q's low-rank pair, the latent's
# down-projection and wkv_b, its up-projection to K,V) and a linear layer's (q, k, v, z; b, a; out)
ATTENTION = ("wq", "wk", "wv", "wo", "wq_a", "wq_b", "wkv_a", "wkv_b", "lin_qkvz", "lin_ba",
             "lin_out")
DENSE_FFN = ("w1", "w3", "w2")
SHARED_FFN = ("shared_w1", "shared_w3", "shared_w2")
EXPERTS = ("experts_w1", "experts_w3", "experts_w2")
# a layer's weights that are no matrix product: norms, biases, attention sinks
NOT_GEMMS = ("attn_norm", "ffn_norm", "post_attn_norm", "post_ffn_norm", "q_norm", "k_norm",
             "bq", "bk", "bv", "bo", "b1", "b3", "b2", "sinks", "router_bias", "experts_b1",
             "experts_b3", "experts_b2", "router_score_bias", "q_a_norm", "kv_a_norm",
             "lin_conv", "lin_dt_bias", "lin_a_log", "lin_norm")


@lru_cache(maxsize=1024)
def gemms(cfg: ModelConfig, layer: int) -> tuple[Gemm, ...]:
    """The matrix products of layer `layer`, in creation order: q, k, v, o; then the dense
    feed-forward, or the router, the routed experts (each run by k/E of the tokens) and the
    shared experts. MLA's and a linear layer's projections count as the attention's (a rank's own
    tokens through wkv_b; the latent ring's rebuild of arriving K,V is `mla_rebuild_flops`); biases,
    norms, sinks and the linear layer's depthwise convolution are not matrix products; any other
    weight is refused by name."""
    shapes = layer_shapes(cfg, layer)
    out = []
    for name, shape in shapes.items():
        if name in NOT_GEMMS:
            continue
        if name in ATTENTION:
            out.append(Gemm(name, *shape))
        elif name in DENSE_FFN or name in SHARED_FFN or name in ("router", "shared_gate"):
            out.append(Gemm(name, *shape, mlp=True))
        elif name in EXPERTS:
            e, rows, cols = shape
            out.append(Gemm(name, rows, cols, e, cfg.experts_per_tok, mlp=True))
        else:
            raise ConfigError(f"model: blocks.{layer}.{name}", list(shape),
                              "is a weight the planner does not price yet")
    return tuple(out)


@lru_cache(maxsize=1024)
def matmul_params(cfg: ModelConfig, layer: int) -> int:
    """Weights one token's forward multiplies by in layer `layer` (2 FLOPs each): its attention's
    projections, and its dense feed-forward or its router, k routed experts and shared experts."""
    return sum(g.per_token for g in gemms(cfg, layer))


@lru_cache(maxsize=1024)
def layer_numel(cfg: ModelConfig, layer: int) -> int:
    """Every parameter of layer `layer` (all of its experts)."""
    return sum(numel(s) for s in layer_shapes(cfg, layer).values())


def largest_layer_numel(cfg: ModelConfig) -> int:
    """The parameters of the largest layer (what FSDP's gather of one block peaks at)."""
    return max(layer_numel(cfg, c.first) for c in layer_classes(cfg))


def routed_numel(cfg: ModelConfig, layer: int) -> int:
    """The routed experts' parameters of layer `layer` (0 in a dense layer)."""
    shapes = layer_shapes(cfg, layer)
    return sum(numel(s) for k, s in shapes.items() if k.startswith("experts_"))


def root_numel(cfg: ModelConfig) -> int:
    """The parameters outside the blocks: the embedding, the final norm, the head unless tied."""
    heads = 1 if cfg.tie_embeddings else 2
    return heads * cfg.vocab * cfg.hidden + cfg.hidden


def model_params(cfg: ModelConfig) -> dict[str, int]:
    """{"total", "active"}: every parameter (a tied embedding once), and those one token's forward
    uses (all but the routed experts it is not sent to; embeddings in both)."""
    return {"total": cfg.params(), "active": cfg.active_params()}


def mla_rebuild_flops(cfg: ModelConfig, tokens: float) -> float:
    """Forward FLOPs of rebuilding `tokens` tokens' K,V from their latent (wkv_b: kv_lora_rank ->
    heads x (qk_nope + v)), what a latent ring step adds for the shard it receives (backward:
    twice this, the latent's gradient and wkv_b's)."""
    nope = cfg.head_dim - cfg.qk_rope_dim
    return 2.0 * tokens * cfg.kv_lora_rank * cfg.heads * (nope + cfg.v_head_dim)


def mla_widths(cfg: ModelConfig) -> tuple[int, int]:
    """(latent, K,V) values one token's MLA ring message carries: kv_lora_rank + qk_rope_dim, or
    every head's key (head_dim) and value (v_head_dim)."""
    return cfg.kv_lora_rank + cfg.qk_rope_dim, cfg.heads * (cfg.head_dim + cfg.v_head_dim)


def mixer_widths(cfg: ModelConfig, layer: int) -> tuple[int, int]:
    """(q, k) values a token's element-wise mixer work touches in layer `layer` (RoPE on q and
    k): softmax attention's heads x head_dim (MLA's keys rebuilt for every head); a linear
    layer's q, and its k and v (the short convolution and the norms)."""
    if cfg.layer_types[layer] == "linear":
        k = cfg.lin_k_heads * cfg.lin_k_dim
        return k, k + cfg.lin_v_heads * cfg.lin_v_dim
    return cfg.heads * cfg.head_dim, (cfg.heads if cfg.mla else cfg.kv_heads) * cfg.head_dim


def ffn_width(cfg: ModelConfig, layer: int) -> float:
    """The feed-forward's inner width a token holds in layer `layer`: the dense ffn, or k routed
    experts' and the shared experts' (an activation counts 4 tensors of this width)."""
    if not cfg.is_moe(layer):
        return cfg.ffn
    return cfg.experts_per_tok * cfg.moe_ffn + cfg.shared_ffn


def routing_width(cfg: ModelConfig, layer: int) -> float:
    """Elements a token's routing holds in an MoE layer beyond the experts' own: the router's
    logits and probabilities (2E), its copy of the input sent to each of k experts and each
    expert's output before the weighted sum (2kd); 0 in a dense layer."""
    if not cfg.is_moe(layer):
        return 0.0
    return 2 * cfg.experts + 2 * cfg.experts_per_tok * cfg.hidden


def norm_width(cfg: ModelConfig) -> float:
    """Elements a token's extra norms hold beyond LLaMA's two RMSNorms: Gemma's post-attention and
    post-feed-forward norms (each its normalised input, output and rsqrt), QK-norm over every q and
    k head (the normalised and scaled copies, an rsqrt a head)."""
    q, kv = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    out = 2 * (2 * cfg.hidden + 1) if cfg.sandwich_norms else 0
    if cfg.qk_norm:
        out += 2 * (q + kv) + cfg.heads + cfg.kv_heads
    return out
