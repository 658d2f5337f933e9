"""The shape of a decoder-only model: the one place its dimensions and its per-layer kinds live.

    cfg = ModelConfig(vocab=97, hidden=64, layers=2, heads=4, kv_heads=2, ffn=128)
    cfg = ModelConfig.load("llama3.1-8b")                  # a preset (a file under MODEL_FILES)
    cfg = ModelConfig.load("my_model.yaml")                # ModelConfig's fields as YAML
    cfg = ModelConfig.load("Qwen3-8B/config.json")         # a Hugging Face config

The decoder is LLaMA's (RMSNorm, RoPE, GQA, a gated feed-forward) with what today's families change
over it, each a field: RoPE scalings and a rotary fraction (`rules.rope`), q/k/v and o biases,
QK-norm, a head_dim of its own, sliding-window layers by `layer_types` (each layer's kind and RoPE
base its own), no-RoPE layers, attention sinks, Gemma's norms, embedding scale and GeGLU, gpt-oss's
clamped SwiGLU, tied embeddings, and mixture-of-experts feed-forward layers (routed and shared
experts, the router's scoring). A config.json is read by `rules.hf_config` (every key modelled,
ignored or refused by name). The presets are files in `seqpar/experiments/models/`: YAML of these
fields (with the `source` of the numbers) or a family's config.json as published.

Pure Python: the planner reads shapes without torch.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path
from typing import Any

from seqpar.errors import ConfigError, require
from seqpar.rules import hf_config
from seqpar.rules.model_shapes import (
    attention_shapes,
    block_numel,
    block_shapes,
    expert_numel,
    ffn_shapes,
    layer_shapes,
    numel,
    param_shapes,
)
from seqpar.rules.rope import Rope

__all__ = ["ACTIVATIONS", "LAYER_KINDS", "MODEL_FILES", "ROUTERS", "ModelConfig",
           "attention_shapes", "block_numel", "block_shapes", "expert_numel", "ffn_shapes",
           "from_hf", "layer_shapes", "load", "numel", "param_shapes", "preset_names", "presets"]

MODEL_FILES = Path(__file__).resolve().parents[1] / "experiments" / "models"

LAYER_KINDS = ("full", "sliding", "linear")  # causal, causal in a window, or linear attention
ACTIVATIONS = ("silu", "gelu_tanh", "swiglu_oai")  # the feed-forward's gate (SwiGLU, GeGLU, gpt-oss)
# MoE scoring: softmax then top-k; top-k then softmax; DeepSeek's sigmoid with group-limited top-k
ROUTERS = ("softmax_topk", "topk_softmax", "sigmoid_group")


@dataclass(frozen=True)
class ModelConfig:
    vocab: int          # tokens in the vocabulary V
    hidden: int         # model dimension
    layers: int         # transformer blocks
    heads: int          # query heads H
    kv_heads: int       # key/value heads Hkv (GQA when < heads)
    ffn: int            # the dense feed-forward's inner dimension
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    # -- attention ---------------------------------------------------------------------------------
    head_dim: int = 0             # per head (0: hidden / heads); Qwen3 and Gemma 3 set their own
    family: str = "llama"         # the model_type it was read from: names its checkpoint's tensors
    rope: Rope | None = None      # the full layers' RoPE (None: default at rope_theta)
    local_rope_theta: float = 0.0  # sliding layers' base, default RoPE (Gemma 3); 0: as full layers
    layer_types: tuple[str, ...] = ()  # each layer's kind (LAYER_KINDS); () -> every layer full
    window: int = 0               # a sliding layer's keys: query t sees t-W+1..t
    nope_layers: tuple[int, ...] = ()  # layers whose queries and keys do not rotate
    qkv_bias: bool = False        # biases on q, k, v (Qwen2, gpt-oss, attention_bias)
    o_bias: bool = False          # a bias on the output projection
    qk_norm: bool = False         # RMSNorm of each q and k head over head_dim (Qwen3, Gemma 3)
    attn_scale: float = 0.0       # softmax scale (0: head_dim^-1/2; Gemma: query_pre_attn_scalar^-1/2)
    sinks: bool = False           # a learned logit per head in every softmax's denominator (gpt-oss)
    attn_gate: bool = False       # the output gated by sigmoid of a second query projection (Qwen3-Next)
    rope_interleave: bool = False  # RoPE on interleaved pairs, not halves (DeepSeek-V3's rope key)
    # -- multi-head latent attention (DeepSeek): kv_lora_rank > 0 -----------------------------------
    q_lora_rank: int = 0          # the query's low-rank bottleneck (0: a full q projection)
    kv_lora_rank: int = 0         # the compressed K,V latent a token keeps (0: no MLA)
    qk_rope_dim: int = 0          # the shared RoPE key's dims (head_dim = nope + rope dims)
    v_head_dim: int = 0           # a value head's dims (0: head_dim)
    # -- linear-attention layers (gated DeltaNet, Qwen3-Next): layer kind "linear" -----------------
    lin_k_heads: int = 0          # key (and query) heads of a linear layer
    lin_v_heads: int = 0          # value heads (each with its own state and gates)
    lin_k_dim: int = 0            # a key head's dims
    lin_v_dim: int = 0            # a value head's dims
    conv_kernel: int = 0          # the short causal convolution's width before the delta rule
    # -- norms, embeddings, feed-forward -----------------------------------------------------------
    norm_offset: bool = False     # norms scale by (1 + weight) in float32 (Gemma)
    sandwich_norms: bool = False  # norms after attention and after the feed-forward too (Gemma)
    embed_scale: bool = False     # embeddings times sqrt(hidden) (Gemma)
    tie_embeddings: bool = False  # the LM head is the embedding matrix
    act: str = "silu"             # ACTIVATIONS
    swiglu_limit: float = 0.0     # swiglu_oai: the clamp of gate and up projections
    mlp_bias: bool = False        # biases on the dense feed-forward's projections
    # -- mixture of experts ------------------------------------------------------------------------
    experts: int = 0              # routed experts per MoE layer (0: a dense model)
    experts_per_tok: int = 0      # experts each token is sent to (top-k)
    moe_ffn: int = 0              # one expert's inner dimension
    shared_ffn: int = 0           # the shared experts' inner dimension (0: none)
    moe_layers: tuple[int, ...] = ()  # the layers whose feed-forward is MoE (() -> all, with experts)
    router: str = "softmax_topk"  # ROUTERS
    norm_topk: bool = True        # softmax_topk: renormalise the chosen experts' weights to sum 1
    router_bias: bool = False     # a bias on the router (gpt-oss)
    expert_bias: bool = False     # biases on the experts' projections (gpt-oss)
    aux_loss_coef: float = 0.0    # the load-balancing loss's weight (0: next-token loss alone)
    shared_gate: bool = False     # the shared experts' output gated by sigmoid(w x) (Qwen3-Next)
    n_group: int = 1              # sigmoid_group: expert groups, of which topk_group are kept
    topk_group: int = 1
    routed_scale: float = 1.0     # sigmoid_group: the routed experts' weights times this

    def __hash__(self) -> int:
        """The dataclass's hash of every field, computed once: the planner's memos look a config
        up tens of thousands of times a plan, and its ~60 fields (a kind a layer) are hashed
        anew each time otherwise. Not pickled (`__getstate__`): a string hashes differently in
        another process."""
        got = self.__dict__.get("_hash")
        if got is None:
            got = hash(tuple([getattr(self, name) for name in _HASHED]))
            object.__setattr__(self, "_hash", got)
        return got

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    def __post_init__(self) -> None:
        for name in ("vocab", "hidden", "layers", "heads", "kv_heads", "ffn"):
            value = getattr(self, name)
            require(_int(value) and value > 0, f"model.{name}", value,
                    "must be a positive integer")
        for name in ("norm_eps", "rope_theta"):
            value = getattr(self, name)
            require(_num(value) and value > 0, f"model.{name}", value, "must be a positive number")
        for name in ("head_dim", "window", "experts", "experts_per_tok", "moe_ffn", "shared_ffn",
                     "q_lora_rank", "kv_lora_rank", "qk_rope_dim", "v_head_dim", "lin_k_heads",
                     "lin_v_heads", "lin_k_dim", "lin_v_dim", "conv_kernel"):
            value = getattr(self, name)
            require(_int(value) and value >= 0, f"model.{name}", value,
                    "must be a non-negative integer")
        if self.head_dim == 0:
            require(self.hidden % self.heads == 0, "model.hidden", self.hidden,
                    f"must be divisible by heads ({self.heads}) unless head_dim is given")
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        require(self.heads % self.kv_heads == 0, "model.kv_heads", self.kv_heads,
                f"must divide heads ({self.heads})")
        require(self.head_dim % 2 == 0, "model.head_dim", self.head_dim,
                "must be even (RoPE rotates pairs of dimensions)")
        if self.v_head_dim == 0:
            object.__setattr__(self, "v_head_dim", self.head_dim)
        if self.kv_lora_rank:
            require(0 < self.qk_rope_dim < self.head_dim and self.qk_rope_dim % 2 == 0,
                    "model.qk_rope_dim", self.qk_rope_dim,
                    f"must be even and below head_dim ({self.head_dim}) with kv_lora_rank")
        else:
            require(not (self.q_lora_rank or self.qk_rope_dim), "model.kv_lora_rank", 0,
                    "must be positive where q_lora_rank or qk_rope_dim are given (MLA)")
        # rope_theta is the base (dataclasses.replace(cfg, rope_theta=...) moves it); rope the rest
        rope = self.rope if self.rope is not None else Rope(theta=self.rope_theta)
        require(isinstance(rope, Rope), "model.rope", rope, "must be a rules.rope.Rope")
        if rope.theta != self.rope_theta:
            rope = dataclasses.replace(rope, theta=float(self.rope_theta))
        rope.rotary_dim(self.head_dim)
        object.__setattr__(self, "rope", rope)
        self._layer_kinds()
        self._moe()
        require(self.act in ACTIVATIONS, "model.act", self.act,
                f"must be one of {', '.join(ACTIVATIONS)}")
        require(self.act != "swiglu_oai" or self.swiglu_limit > 0, "model.swiglu_limit",
                self.swiglu_limit, "must be positive with act swiglu_oai")
        require(_num(self.attn_scale) and self.attn_scale >= 0, "model.attn_scale",
                self.attn_scale, "must be a non-negative number (0: head_dim^-1/2)")

    def _layer_kinds(self) -> None:
        kinds = tuple(self.layer_types) or (("sliding" if self.window else "full"),) * self.layers
        require(len(kinds) == self.layers, "model.layer_types", len(kinds),
                f"must name one kind per layer ({self.layers})")
        bad = [k for k in kinds if k not in LAYER_KINDS]
        require(not bad, "model.layer_types", bad[0] if bad else None,
                f"must be one of {', '.join(LAYER_KINDS)}")
        require(("sliding" not in kinds) or self.window > 0, "model.window", self.window,
                "must be positive where a layer is sliding")
        if "linear" in kinds:
            dims = (self.lin_k_heads, self.lin_v_heads, self.lin_k_dim, self.lin_v_dim,
                    self.conv_kernel)
            require(all(dims) and self.lin_v_heads % self.lin_k_heads == 0, "model.lin_v_heads",
                    self.lin_v_heads, "a linear layer needs lin_k_heads dividing lin_v_heads, "
                    "lin_k_dim, lin_v_dim and conv_kernel")
        object.__setattr__(self, "layer_types", kinds)
        nope = tuple(sorted(set(self.nope_layers)))
        require(all(_int(i) and 0 <= i < self.layers for i in nope), "model.nope_layers",
                list(nope), f"must be layer indices in 0..{self.layers - 1}")
        object.__setattr__(self, "nope_layers", nope)

    def _moe(self) -> None:
        require(self.router in ROUTERS, "model.router", self.router,
                f"must be one of {', '.join(ROUTERS)}")
        if not self.experts:
            require(not self.moe_layers and not self.experts_per_tok, "model.experts", 0,
                    "must be positive where moe_layers or experts_per_tok are given")
            return
        require(0 < self.experts_per_tok <= self.experts, "model.experts_per_tok",
                self.experts_per_tok, f"must be in 1..experts ({self.experts})")
        if not self.moe_ffn:
            object.__setattr__(self, "moe_ffn", self.ffn)
        layers = tuple(sorted(set(self.moe_layers))) or tuple(range(self.layers))
        require(all(_int(i) and 0 <= i < self.layers for i in layers), "model.moe_layers",
                list(layers), f"must be layer indices in 0..{self.layers - 1}")
        object.__setattr__(self, "moe_layers", layers)

    def is_moe(self, layer: int) -> bool:
        return layer in self.moe_layers

    @property
    def mla(self) -> bool:
        """Multi-head latent attention in every softmax layer (DeepSeek)."""
        return self.kv_lora_rank > 0

    @property
    def window_of(self) -> tuple[int | None, ...]:
        """Each layer's window (None: full causal)."""
        return tuple(self.window if k == "sliding" else None for k in self.layer_types)

    def params(self) -> int:
        """Every parameter (the embedding once when tied)."""
        return sum(numel(s) for s in param_shapes(self).values())

    def active_params(self) -> int:
        """The parameters one token's forward uses: all but the routed experts it is not sent to."""
        idle = (self.experts - self.experts_per_tok) * expert_numel(self)
        return self.params() - idle * len(self.moe_layers)

    @classmethod
    def preset(cls, name: str) -> ModelConfig:
        """A preset by name (`preset_names()`)."""
        got = presets()
        require(name in got, "model", name, f"must be one of {', '.join(got)}")
        return got[name]

    @classmethod
    def load(cls, name_or_path: str) -> ModelConfig:
        """A preset name, a YAML file of ModelConfig's fields, or a Hugging Face config.json."""
        return load(name_or_path)


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# the fields the dataclass's own __hash__ would hash, in its order
_HASHED = tuple(f.name for f in fields(ModelConfig) if (f.compare if f.hash is None else f.hash))

def _num(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _fields(data: dict[str, Any], where: str) -> ModelConfig:
    known = {f.name for f in fields(ModelConfig)}
    unknown = sorted(set(data) - known)
    require(not unknown, where, unknown[0] if unknown else None,
            f"is not a field of ModelConfig ({', '.join(sorted(known))})")
    missing = sorted({"vocab", "hidden", "layers", "heads", "kv_heads", "ffn"} - set(data))
    require(not missing, where, missing[0] if missing else None, "is missing")
    data = dict(data)
    if isinstance(data.get("rope"), dict):
        data["rope"] = Rope(**data["rope"])
    for name in ("layer_types", "nope_layers", "moe_layers"):
        if isinstance(data.get(name), list):
            data[name] = tuple(data[name])
    return ModelConfig(**data)


def from_hf(config: dict[str, Any], where: str = "config.json") -> ModelConfig:
    """A Hugging Face config.json (the families of `rules.hf_config`) as a ModelConfig: every
    field that changes the function modelled or refused by name."""
    return _fields(hf_config.read(config, where), where)


def _flat_yaml(text: str) -> dict[str, Any]:
    """A flat mapping of `key: value` lines (what a model file holds); ValueError on anything
    else."""
    out: dict[str, Any] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        key, sep, value = line.partition(":")
        if not sep:
            raise ValueError(f"not a 'key: value' line: {line!r}")
        value = value.strip().strip("'\"")
        for kind in (int, float):
            try:
                value = kind(value)
                break
            except ValueError:
                pass
        out[key.strip()] = value
    return out


def _yaml(text: str) -> Any:
    """A model file's mapping: flat `key: value` lines without PyYAML (the presets: a bare machine
    with torch alone reads them), anything else with it."""
    try:
        return _flat_yaml(text)
    except ValueError:
        pass
    import yaml  # optional: only for model files that are not flat

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ValueError(str(err)) from None


def _read(path: Path) -> ModelConfig:
    try:
        text = path.read_text()
        data = json.loads(text) if path.suffix == ".json" else _yaml(text)
    except (OSError, ValueError) as err:
        raise ConfigError("model", str(path), f"cannot be read: {err}") from None
    if path.suffix == ".json" or (isinstance(data, dict) and "hidden_size" in data):
        return from_hf(data, path.name)
    require(isinstance(data, dict), "model", str(path), "must hold a mapping of ModelConfig's fields")
    data = {k: v for k, v in data.items() if k != "source"}
    return _fields(data, f"model {path.name}")


@lru_cache(maxsize=1)
def presets() -> dict[str, ModelConfig]:
    """Every preset, by name, in a stable (sorted) order."""
    files = [*MODEL_FILES.glob("*.yaml"), *MODEL_FILES.glob("*.json")]
    return {p.stem: _read(p) for p in sorted(files, key=lambda p: p.stem)}


def preset_names() -> list[str]:
    return list(presets())


def load(name_or_path: str | Path) -> ModelConfig:
    """A preset name, a YAML file of ModelConfig's fields, or a Hugging Face config.json (the one
    loader the planner and the runner share)."""
    name = str(name_or_path)
    if name in presets():
        return presets()[name]
    path = Path(name)
    looks_like_file = path.suffix in (".yaml", ".yml", ".json") or "/" in name
    require(not looks_like_file or path.is_file(), "model", name,
            "no such file (a preset name, a YAML file of ModelConfig's fields or a Hugging Face "
            "config.json)")
    require(path.suffix in (".yaml", ".yml", ".json") and path.is_file(), "model", name,
            f"must be one of {', '.join(presets())}, a YAML file of ModelConfig's fields or a "
            "Hugging Face config.json")
    return _read(path)
