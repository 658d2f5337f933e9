"""Hugging Face checkpoints (safetensors, one file or sharded) of every family seqpar models, loaded
straight into each rank's shards, for continued training at long context.

    net = Transformer(cfg, attention="ring", mesh=mesh, states="fsdp", device="cuda", ...)
    hf.load(net, "/path/to/Meta-Llama-3.1-8B")   # every rank calls it; no collective

Each of seqpar's parameters has a source in the checkpoint (`sources`): one tensor under the
family's name (`hf_name`), the experts' per-expert tensors stacked (Mixtral's `experts.{j}.w1`,
Qwen3-MoE's `experts.{j}.gate_proj`), or a slice of a fused one (transformers 5's
`experts.gate_up_proj`, gpt-oss's interleaved and transposed `gate_up_proj` and its biases). A
rank reads rows [start, stop) of dimension 0 only (the rows its FSDP2 shard holds, every row under
replicated states; safetensors slices), so no rank ever holds a whole model; values are cast to the
parameters' dtype as they are copied (a bf16 checkpoint into fp32 master weights).

The model's shape comes from its `ModelConfig`, built from the checkpoint's config.json; a tensor
whose shape differs, a missing tensor and an unexpected one are one-line errors naming it, before
anything is read. Skipped as the families' reference skips them: `rotary_emb.inv_freq` buffers
(older checkpoints; transformers drops them), a tied model's `lm_head.weight` (the reference ties
the head to the embedding), a Gemma 3 multimodal checkpoint's vision tower and projector (the
text decoder is what seqpar trains) and DeepSeek's multi-token-prediction layer (said once). An
untied model read from a checkpoint without `lm_head.weight` takes its head from the embedding.
Needs the `safetensors` package (`pip install seqpar[hf]`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from seqpar.errors import ConfigError, require
from seqpar.model.init import shard_rows
from seqpar.rules.model import ModelConfig, layer_shapes

# seqpar's parameter names -> the families' names in a layer (LLaMA's, and what others change)
_BLOCK = {"attn_norm": "input_layernorm.weight", "ffn_norm": "post_attention_layernorm.weight",
          "wq": "self_attn.q_proj.weight", "wk": "self_attn.k_proj.weight",
          "wv": "self_attn.v_proj.weight", "wo": "self_attn.o_proj.weight",
          "bq": "self_attn.q_proj.bias", "bk": "self_attn.k_proj.bias",
          "bv": "self_attn.v_proj.bias", "bo": "self_attn.o_proj.bias",
          "q_norm": "self_attn.q_norm.weight", "k_norm": "self_attn.k_norm.weight",
          "sinks": "self_attn.sinks",
          "w1": "mlp.gate_proj.weight", "w3": "mlp.up_proj.weight", "w2": "mlp.down_proj.weight",
          "b1": "mlp.gate_proj.bias", "b3": "mlp.up_proj.bias", "b2": "mlp.down_proj.bias",
          # multi-head latent attention (DeepSeek, Kimi K2)
          "wq_a": "self_attn.q_a_proj.weight", "q_a_norm": "self_attn.q_a_layernorm.weight",
          "wq_b": "self_attn.q_b_proj.weight", "wkv_a": "self_attn.kv_a_proj_with_mqa.weight",
          "kv_a_norm": "self_attn.kv_a_layernorm.weight", "wkv_b": "self_attn.kv_b_proj.weight",
          # gated DeltaNet (Qwen3-Next's linear layers)
          "lin_qkvz": "linear_attn.in_proj_qkvz.weight", "lin_ba": "linear_attn.in_proj_ba.weight",
          "lin_conv": "linear_attn.conv1d.weight", "lin_dt_bias": "linear_attn.dt_bias",
          "lin_a_log": "linear_attn.A_log", "lin_norm": "linear_attn.norm.weight",
          "lin_out": "linear_attn.out_proj.weight"}
_SANDWICH = {"ffn_norm": "pre_feedforward_layernorm.weight",  # Gemma
             "post_attn_norm": "post_attention_layernorm.weight",
             "post_ffn_norm": "post_feedforward_layernorm.weight"}
_DEEPSEEK = ("deepseek_v2", "deepseek_v3", "kimi_k2")
_ROUTER = {"mixtral": "gate.weight", "qwen3_moe": "gate.weight", "gpt_oss": "router.weight",
           "qwen3_next": "gate.weight",
           **dict.fromkeys(_DEEPSEEK, "gate.weight")}
_GATE_UP_DOWN = {"experts_w1": "gate_proj", "experts_w3": "up_proj", "experts_w2": "down_proj"}
_PER_EXPERT = {"mixtral": {"experts_w1": "w1", "experts_w3": "w3", "experts_w2": "w2"},
               "qwen3_moe": _GATE_UP_DOWN, "qwen3_next": _GATE_UP_DOWN,
               **dict.fromkeys(_DEEPSEEK, _GATE_UP_DOWN)}
# the MoE layer's own parameters beyond the experts, by family: DeepSeek's router score bias
# (e_score_correction_bias) and shared experts
_MOE_EXTRA = dict.fromkeys(_DEEPSEEK, {
    "router_score_bias": "gate.e_score_correction_bias",
    "shared_w1": "shared_experts.gate_proj.weight", "shared_w3": "shared_experts.up_proj.weight",
    "shared_w2": "shared_experts.down_proj.weight"})
_MOE_EXTRA["qwen3_next"] = {  # one shared expert, gated
    "shared_w1": "shared_expert.gate_proj.weight", "shared_w3": "shared_expert.up_proj.weight",
    "shared_w2": "shared_expert.down_proj.weight", "shared_gate": "shared_expert_gate.weight"}
# where the text decoder sits: a causal LM's, or Gemma 3's multimodal checkpoint (old and new)
_PREFIXES = (("model.", "lm_head.weight"),
             ("language_model.model.", "language_model.lm_head.weight"),
             ("model.language_model.", "lm_head.weight"))
_VISION = re.compile(r"^(model\.)?(vision_tower|multi_modal_projector)\.")
_SKIPPED = re.compile(r"rotary_emb\.inv_freq$")


@dataclass(frozen=True)
class Source:
    """Where one parameter's values come from: `keys` read rows [a, b) each (dimension 0: the
    parameter's own), `make` turns them into the parameter's rows; `shapes` what each key must
    be."""

    keys: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    make: Callable[..., torch.Tensor] = lambda t: t
    stacked: bool = False  # keys[j] is row j whole (per-expert tensors)


def _prefix(names: set[str]) -> tuple[str, str]:
    """(the decoder's prefix, the head's name) of a checkpoint holding these tensors."""
    for prefix, head in _PREFIXES:
        if prefix + "embed_tokens.weight" in names:
            return prefix, head
    return _PREFIXES[0]


def hf_name(name: str, cfg: ModelConfig | None = None, prefix: str = "model.") -> str:
    """The checkpoint name of one of seqpar's parameters held in one tensor (`blocks.3.wq` ->
    `model.layers.3.self_attn.q_proj.weight`); `cfg` names the family's (LLaMA's without)."""
    if name in ("embed", "norm"):
        return prefix + {"embed": "embed_tokens.weight", "norm": "norm.weight"}[name]
    if name == "head":
        return "lm_head.weight"
    parts = name.split(".")
    leaf = parts[-1]
    sandwich = cfg is not None and cfg.sandwich_norms and leaf in _SANDWICH
    require(len(parts) == 3 and parts[0] == "blocks" and (leaf in _BLOCK or sandwich),
            "parameter", name, "is not one of seqpar's decoder parameters named alike in every "
            "family's checkpoint")
    return f"{prefix}layers.{parts[1]}." + (_SANDWICH[leaf] if sandwich else _BLOCK[leaf])


def _expert_sources(cfg: ModelConfig, layer: str, moe: str, names: set[str]) -> dict[str, Source]:
    """The routed experts' sources of one layer (`layer`: its prefix, `moe`: its MoE module's)."""
    e, f, d = cfg.experts, cfg.moe_ffn, cfg.hidden
    if cfg.family == "gpt_oss":  # (E, d, 2f) gate and up interleaved, x @ W: transposed
        gu, down = layer + "mlp.experts.gate_up_proj", layer + "mlp.experts.down_proj"
        fused = ((e, d, 2 * f),)
        out = {"experts_w1": Source((gu,), fused, lambda t: t[..., ::2].transpose(1, 2)),
               "experts_w3": Source((gu,), fused, lambda t: t[..., 1::2].transpose(1, 2)),
               "experts_w2": Source((down,), ((e, f, d),), lambda t: t.transpose(1, 2))}
        if cfg.expert_bias:
            out.update(experts_b1=Source((gu + "_bias",), ((e, 2 * f),), lambda t: t[:, ::2]),
                       experts_b3=Source((gu + "_bias",), ((e, 2 * f),), lambda t: t[:, 1::2]),
                       experts_b2=Source((down + "_bias",), ((e, d),)))
        return out
    fused = layer + "mlp.experts.gate_up_proj"
    if fused in names:  # transformers 5's own form: (E, 2f, d) gate then up; (E, d, f)
        return {"experts_w1": Source((fused,), ((e, 2 * f, d),), lambda t: t[:, :f]),
                "experts_w3": Source((fused,), ((e, 2 * f, d),), lambda t: t[:, f:]),
                "experts_w2": Source((layer + "mlp.experts.down_proj",), ((e, d, f),))}
    out = {}
    for ours, theirs in _PER_EXPERT[cfg.family].items():
        shape = (d, f) if ours == "experts_w2" else (f, d)
        keys = tuple(f"{layer}{moe}experts.{j}.{theirs}.weight" for j in range(e))
        out[ours] = Source(keys, (shape,) * e, stacked=True)
    return out


def sources(cfg: ModelConfig, names: set[str]) -> dict[str, Source]:
    """{seqpar's parameter name: its Source} for a checkpoint holding tensors `names`."""
    prefix, head = _prefix(names)
    shapes = {"embed": (cfg.vocab, cfg.hidden), "norm": (cfg.hidden,)}
    out = {k: Source((hf_name(k, cfg, prefix),), (s,)) for k, s in shapes.items()}
    if not cfg.tie_embeddings:
        key = head if head in names else hf_name("embed", cfg, prefix)  # an untied model, tied file
        out["head"] = Source((key,), ((cfg.vocab, cfg.hidden),))
    for i in range(cfg.layers):
        layer = f"{prefix}layers.{i}."
        moe = ("block_sparse_moe." if cfg.family == "mixtral"
               and f"{layer}block_sparse_moe.gate.weight" in names else "mlp.")
        own = layer_shapes(cfg, i)
        experts = _expert_sources(cfg, layer, moe, names) if cfg.is_moe(i) else {}
        for leaf, shape in own.items():
            name = f"blocks.{i}.{leaf}"
            if leaf in experts:
                out[name] = experts[leaf]
            elif leaf in ("router", "router_bias"):
                key = _ROUTER[cfg.family] if leaf == "router" else "router.bias"
                out[name] = Source((layer + moe + key,), (shape,))
            elif leaf in _MOE_EXTRA.get(cfg.family, {}):
                out[name] = Source((layer + moe + _MOE_EXTRA[cfg.family][leaf],), (shape,))
            else:
                out[name] = Source((hf_name(name, cfg, prefix),), (shape,))
    return out


def checkpoint_files(path: str) -> dict[str, Path]:
    """{tensor name: the .safetensors file in directory `path` holding it} (headers only)."""
    from safetensors import safe_open

    out: dict[str, Path] = {}
    for file in sorted(Path(path).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            out.update(dict.fromkeys(f.keys(), file))
    return out


def checkpoint_shapes(path: str) -> dict[str, tuple[int, ...]]:
    """{tensor name: shape} of the safetensors files in `path` (their headers only)."""
    from safetensors import safe_open

    out: dict[str, tuple[int, ...]] = {}
    for file in sorted(Path(path).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            out.update({k: tuple(f.get_slice(k).get_shape()) for k in f.keys()})
    return out


def _check(cfg: ModelConfig, path: str, shapes: dict[str, tuple[int, ...]],
           plan: dict[str, Source]) -> None:
    """Every source present with its shape, and no tensor left unread that the reference reads."""
    quantized = sorted(k for k in shapes if k.endswith(("_blocks", "_scales")))
    require(not quantized, "checkpoint", path,
            f"holds {quantized[0] if quantized else ''}: MXFP4-quantized experts (gpt-oss as "
            "published) are not read; dequantize them first (transformers' "
            "Mxfp4Config(dequantize=True), then save_pretrained)")
    used: set[str] = set()
    for name, src in plan.items():
        for key, shape in zip(src.keys, src.shapes, strict=True):
            if key not in shapes:
                raise ConfigError("checkpoint", path, f"has no tensor {key} (seqpar's {name})")
            require(shapes[key] == shape, "checkpoint", path,
                    f"{key} is {list(shapes[key])}, the model's {name} needs {list(shape)}: "
                    "build the ModelConfig from the checkpoint's config.json")
            used.add(key)
    prefix, head = _prefix(set(shapes))
    vision = prefix != _PREFIXES[0][0]  # a multimodal checkpoint: its image encoder is not ours
    mtp = _mtp_tensors(cfg, prefix, shapes)
    extra = sorted(k for k in shapes if k not in used and not _SKIPPED.search(k)
                   and not (cfg.tie_embeddings and k == head)
                   and not (vision and _VISION.match(k)) and k not in mtp)
    require(not extra, "checkpoint", path,
            f"holds {extra[0] if extra else ''}, which the {cfg.family} model of its config.json "
            "does not have (a checkpoint of another model, or a config.json that leaves it out)")


def _mtp_tensors(cfg: ModelConfig, prefix: str, shapes: dict[str, tuple[int, ...]]) -> set[str]:
    """A DeepSeek checkpoint's multi-token-prediction layers (`model.layers.{num_hidden_layers}.*`
    on: DeepSeek-V3's layer 61), which transformers skips by name and seqpar too, saying so once
    a load."""
    if cfg.family not in _DEEPSEEK:
        return set()
    first = re.compile(rf"^{re.escape(prefix)}layers\.(\d+)\.")
    found = {k for k in shapes if (m := first.match(k)) and int(m[1]) >= cfg.layers}
    if found:
        logging.getLogger("seqpar.hf").warning(
            "skipping the %d tensors of the multi-token-prediction layer (%slayers.%d.* on), as "
            "transformers does: seqpar trains the next-token model", len(found), prefix,
            cfg.layers)
    return found


def load(net: nn.Module, path: str) -> None:
    """Read the checkpoint in directory `path` into `net`'s parameters (every rank of the model
    calls it; each reads only the rows it holds)."""
    from safetensors import safe_open

    shapes = checkpoint_shapes(path)
    require(bool(shapes), "checkpoint", path, "holds no .safetensors file")
    experts = getattr(net, "experts", None)  # expert parallelism: a rank holds an EP slice
    require(experts is None, "ep", getattr(experts, "ep", None), "a checkpoint loads with ep 1 "
            "only (hf.load reads whole expert tensors, not a rank's EP slice)")
    cfg: ModelConfig = net.cfg
    plan = sources(cfg, set(shapes))
    params = dict(net.named_parameters())
    assert set(plan) == set(params), sorted(set(plan) ^ set(params))  # both from layer_shapes
    _check(cfg, path, shapes, plan)
    files = checkpoint_files(path)
    handles = {file: safe_open(str(file), framework="pt") for file in set(files.values())}
    with torch.no_grad():
        for name, p in params.items():
            src = plan[name]
            start, stop = shard_rows(p)
            local = p.to_local() if hasattr(p, "to_local") else p
            if stop == start:
                continue
            if src.stacked:
                rows = torch.stack([handles[files[k]].get_tensor(k) for k in src.keys[start:stop]])
            else:
                rows = src.make(*(handles[files[k]].get_slice(k)[start:stop] for k in src.keys))
            local.copy_(rows)
