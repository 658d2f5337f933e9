"""The shape of a decoder-only (LLaMA-style) model: the one place its dimensions live.

    cfg = ModelConfig(vocab=97, hidden=64, layers=2, heads=4, kv_heads=2, ffn=128)
    cfg = ModelConfig.load("llama3.1-8b")                  # a preset (a file under MODEL_FILES)
    cfg = ModelConfig.load("my_model.yaml")                # ModelConfig's fields as YAML
    cfg = ModelConfig.load("Llama-3.1-8B/config.json")     # a Hugging Face config

The presets are files in `seqpar/experiments/models/` (one YAML of ModelConfig's fields each, with
the `source` of its numbers): the papers' models (LLaMA-2 7B, LLaMA-3 8B, BurstEngine's 14B),
today's (Llama-3.1 8B and 70B, Qwen2.5-14B) and `tiny`, which two CPU cores train in seconds. A
Hugging Face `config.json` of a LLaMA/Mistral/Qwen-style decoder maps hidden_size, intermediate_size,
num_attention_heads, num_key_value_heads, num_hidden_layers, vocab_size, rope_theta and
rms_norm_eps; what this decoder cannot be (tied embeddings, a head_dim other than hidden / heads,
a sliding window) is refused with the reason.

Pure Python: the planner reads shapes without torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path
from typing import Any

from seqpar.errors import ConfigError, require

MODEL_FILES = Path(__file__).resolve().parents[1] / "experiments" / "models"

# Hugging Face config.json key -> ModelConfig field
HF_FIELDS = {"vocab_size": "vocab", "hidden_size": "hidden", "num_hidden_layers": "layers",
             "num_attention_heads": "heads", "num_key_value_heads": "kv_heads",
             "intermediate_size": "ffn", "rms_norm_eps": "norm_eps", "rope_theta": "rope_theta"}


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
            require(isinstance(value, int) and not isinstance(value, bool) and value > 0,
                    f"model.{name}", value, "must be a positive integer")
        for name in ("norm_eps", "rope_theta"):
            value = getattr(self, name)
            require(isinstance(value, int | float) and not isinstance(value, bool) and value > 0,
                    f"model.{name}", value, "must be a positive number")
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
        return 2 * self.vocab * self.hidden + self.hidden + self.layers * block_numel(self)

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


def numel(shape: tuple[int, ...]) -> int:
    out = 1
    for n in shape:
        out *= n
    return out


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


@lru_cache(maxsize=256)
def block_numel(cfg: ModelConfig) -> int:
    """Parameters of one block."""
    return sum(numel(s) for s in block_shapes(cfg).values())


def _fields(data: dict[str, Any], where: str) -> ModelConfig:
    known = {f.name for f in fields(ModelConfig)}
    unknown = sorted(set(data) - known)
    require(not unknown, where, unknown[0] if unknown else None,
            f"is not a field of ModelConfig ({', '.join(sorted(known))})")
    missing = sorted({"vocab", "hidden", "layers", "heads", "kv_heads", "ffn"} - set(data))
    require(not missing, where, missing[0] if missing else None, "is missing")
    return ModelConfig(**data)


def from_hf(config: dict[str, Any], where: str = "config.json") -> ModelConfig:
    """A LLaMA/Mistral/Qwen-style Hugging Face config as a ModelConfig (refusing what this decoder
    cannot be, with the reason)."""
    require(isinstance(config, dict), where, type(config).__name__, "must be a JSON object")
    data = {ours: config[theirs] for theirs, ours in HF_FIELDS.items() if config.get(theirs)
            is not None}
    data.setdefault("kv_heads", data.get("heads"))  # older LLaMA configs: MHA, no key
    require(not config.get("tie_word_embeddings", False), f"{where}: tie_word_embeddings", True,
            "is not supported: this decoder keeps a separate LM head (untied)")
    head_dim = config.get("head_dim")
    if head_dim is not None and "hidden" in data and "heads" in data:
        require(head_dim == data["hidden"] // data["heads"], f"{where}: head_dim", head_dim,
                f"must be hidden_size / num_attention_heads "
                f"({data['hidden']} / {data['heads']}) in this decoder")
    window = config.get("sliding_window") if config.get("use_sliding_window", True) else None
    require(window is None, f"{where}: sliding_window", window,
            "is not supported (full causal attention only); set it to null")
    missing = [k for k, v in HF_FIELDS.items() if v in ("vocab", "hidden", "layers", "heads", "ffn")
               and v not in data]
    require(not missing, where, missing[0] if missing else None, "is missing (a LLaMA-style "
            "config.json has hidden_size, intermediate_size, num_attention_heads, "
            "num_key_value_heads, num_hidden_layers, vocab_size)")
    return _fields(data, where)


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
    return {p.stem: _read(p) for p in sorted(MODEL_FILES.glob("*.yaml"))}


def preset_names() -> list[str]:
    return list(presets())


def load(name_or_path: str | Path) -> ModelConfig:
    """A preset name, a YAML file of ModelConfig's fields, or a Hugging Face config.json (the one
    loader the planner and the runner share)."""
    name = str(name_or_path)
    if name in presets():
        return presets()[name]
    path = Path(name)
    require(path.suffix in (".yaml", ".yml", ".json") and path.is_file(), "model", name,
            f"must be one of {', '.join(presets())}, a YAML file of ModelConfig's fields or a "
            "Hugging Face config.json")
    return _read(path)
