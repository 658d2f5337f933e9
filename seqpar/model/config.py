"""The shape of a decoder-only (LLaMA-style) model: the one place its dimensions live.

    cfg = ModelConfig(vocab=97, hidden=64, layers=2, heads=4, kv_heads=2, ffn=128)
    cfg = ModelConfig.preset("llama2-7b")

The presets are the papers' models: LLaMA-2 7B (LoongTrain, WallFacer, BurstEngine's 7B), LLaMA-3 8B
(the GQA case, H/Hkv = 4), BurstEngine's 14B (40 layers, 40 heads, 5120 dimensions, 120K vocabulary,
BurstEngine §4.1) and `tiny`, which two CPU cores train in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from seqpar.errors import require


@dataclass(frozen=True)
class ModelConfig:
    vocab: int          # tokens in the vocabulary V
    hidden: int         # model dimension (H x head_dim)
    layers: int         # transformer blocks
    heads: int          # query heads H
    kv_heads: int       # key/value heads Hkv (GQA when < heads)
    ffn: int            # SwiGLU inner dimension
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0

    def __post_init__(self) -> None:
        for name in ("vocab", "hidden", "layers", "heads", "kv_heads", "ffn"):
            value = getattr(self, name)
            require(isinstance(value, int) and value > 0, f"model.{name}", value,
                    "must be a positive integer")
        require(self.hidden % self.heads == 0, "model.hidden", self.hidden,
                f"must be divisible by heads ({self.heads})")
        require(self.heads % self.kv_heads == 0, "model.kv_heads", self.kv_heads,
                f"must divide heads ({self.heads})")
        require(self.head_dim % 2 == 0, "model.hidden", self.hidden,
                "hidden / heads must be even (RoPE rotates pairs of dimensions)")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def params(self) -> int:
        """Parameters: embedding, per block (norms, q/k/v/o projections, SwiGLU), final norm, head."""
        total = 0
        for shape in param_shapes(self).values():
            n = 1
            for size in shape:
                n *= size
            total += n
        return total

    @classmethod
    def preset(cls, name: str) -> ModelConfig:
        require(name in PRESETS, "model", name, f"must be one of {', '.join(PRESETS)}")
        return PRESETS[name]


def block_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """One block's parameters, in the order they are created (and drawn from the seed)."""
    d, kv, f = cfg.hidden, cfg.kv_heads * cfg.head_dim, cfg.ffn
    return {"attn_norm": (d,), "ffn_norm": (d,), "wq": (d, d), "wk": (kv, d), "wv": (kv, d),
            "wo": (d, d), "w1": (f, d), "w3": (f, d), "w2": (d, f)}


def param_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter of the decoder by name (`Transformer.named_parameters()` order)."""
    out: dict[str, tuple[int, ...]] = {"embed": (cfg.vocab, cfg.hidden), "norm": (cfg.hidden,),
                                       "head": (cfg.vocab, cfg.hidden)}
    for i in range(cfg.layers):
        out.update({f"blocks.{i}.{k}": s for k, s in block_shapes(cfg).items()})
    return out


PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(vocab=256, hidden=64, layers=2, heads=4, kv_heads=2, ffn=176),
    "llama2-7b": ModelConfig(vocab=32000, hidden=4096, layers=32, heads=32, kv_heads=32, ffn=11008),
    "llama3-8b": ModelConfig(vocab=128256, hidden=4096, layers=32, heads=32, kv_heads=8, ffn=14336,
                             rope_theta=500000.0),
    "14b": ModelConfig(vocab=120000, hidden=5120, layers=40, heads=40, kv_heads=40, ffn=13824),
}
