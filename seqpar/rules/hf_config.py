"""Hugging Face config.json files read field by field: each family's keys modelled, ignored (they do
not change the function: token ids, dtypes, cache flags, versions) or refused by name.

    fields = read(json.load(open("config.json")))   # ModelConfig's fields, as a dict

The families are those of Hugging Face transformers (their reference), by `model_type`: llama,
mistral, qwen2, qwen3, smollm3, gemma3 / gemma3_text, gpt_oss, mixtral, qwen3_moe. A key no family
knows is refused with its name and value; so are the architectures seqpar does not model (multi-head
latent attention, linear-attention and state-space layers, logit soft-capping, ...). Both the
legacy keys (`rope_theta`, `rope_scaling`, `rope_local_base_freq`, `num_experts`, ...) and
transformers 5's `rope_parameters` are read. Pure Python: the planner reads configs without torch.
"""

from __future__ import annotations

import math
from typing import Any

from seqpar.errors import ConfigError, require
from seqpar.rules.hf_defaults import with_defaults
from seqpar.rules.rope import Rope

# keys that do not change what the model computes
IGNORED = frozenset({
    "architectures", "model_type", "torch_dtype", "dtype", "transformers_version", "_name_or_path",
    "bos_token_id", "eos_token_id", "pad_token_id", "use_cache", "initializer_range",
    "max_position_embeddings", "output_attentions", "output_hidden_states", "return_dict",
    "id2label", "label2id", "problem_type", "is_encoder_decoder", "chunk_size_feed_forward",
    "pretraining_tp", "auto_map", "quantization_config", "cache_implementation",
    "max_window_layers", "use_sliding_window", "_sliding_window_pattern", "sliding_window_pattern",
    "no_rope_layer_interval", "router_aux_loss_coef", "output_router_logits", "tokenizer_class",
    "use_return_dict", "torchscript", "tie_encoder_decoder", "finetuning_task", "prefix",
    "task_specific_params", "eos_token", "bos_token", "pad_token", "unsloth_version",
    "image_token_index", "boi_token_index", "eoi_token_index", "mm_tokens_per_image",
    "vision_config", "vision_feature_layer", "initializer_factor",
})
# keys of architectures seqpar does not model, refused whatever their value unless neutral
NOT_MODELLED = {
    "ssm_state_size": "state-space (Mamba) layers are not modelled",
    "mamba_d_state": "state-space (Mamba) layers are not modelled",
    "attn_logit_softcapping": "attention logit soft-capping (Gemma 2) is not modelled",
    "final_logit_softcapping": "final logit soft-capping (Gemma 2) is not modelled",
    "attention_chunk_size": "chunked attention (Llama 4) is not modelled",
    "router_jitter_noise": "router jitter noise is not modelled (it draws noise each step)",
    "use_bidirectional_attention": "bidirectional attention is not modelled (a decoder is causal)",
    "attention_dropout": "attention dropout is not modelled (it draws noise each step)",
    "hidden_dropout": "dropout is not modelled (it draws noise each step)",
}
NEUTRAL = (None, 0, 0.0, False, [], "")
# families whose sliding layers slide only with use_sliding_window (else their window is None)
WINDOW_SWITCH = ("qwen2", "qwen3", "qwen3_moe", "smollm3")
KINDS = {"full_attention": "full", "sliding_attention": "sliding", "linear_attention": "linear"}

BASE = {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "intermediate_size", "rms_norm_eps", "rope_theta", "rope_scaling",
        "rope_parameters", "head_dim", "tie_word_embeddings",
        "hidden_act", "sliding_window", "layer_types"}
MOE = {"num_local_experts", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
       "decoder_sparse_step", "mlp_only_layers", "norm_topk_prob"}
# model_type -> the keys it may carry beyond BASE (and IGNORED, NOT_MODELLED)
FAMILIES: dict[str, set[str]] = {
    "llama": {"attention_bias", "mlp_bias"},
    "mistral": set(),
    "qwen2": set(),
    "qwen3": {"attention_bias"},
    "smollm3": {"attention_bias", "mlp_bias", "no_rope_layers"},
    "gemma3_text": {"attention_bias", "hidden_activation", "query_pre_attn_scalar",
                    "rope_local_base_freq"},
    "gpt_oss": {"attention_bias", "swiglu_limit", "swiglu_alpha", "experts_per_token",
                "initial_context_length"} | MOE,
    "mixtral": MOE,
    "qwen3_moe": {"attention_bias"} | MOE,
}
DEEPSEEK = {"attention_bias", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
            "qk_head_dim", "v_head_dim", "n_routed_experts", "n_shared_experts",
            "num_experts_per_tok", "moe_intermediate_size", "first_k_dense_replace",
            "moe_layer_freq", "n_group", "topk_group", "topk_method", "scoring_func",
            "routed_scaling_factor", "norm_topk_prob", "rope_interleave", "ep_size",
            "num_nextn_predict_layers", "aux_loss_alpha", "seq_aux", "mlp_bias"}
FAMILIES.update({
    "deepseek_v2": DEEPSEEK, "deepseek_v3": DEEPSEEK, "kimi_k2": DEEPSEEK,
    "qwen3_next": {"attention_bias", "partial_rotary_factor", "linear_num_key_heads",
                   "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                   "linear_conv_kernel_dim", "full_attention_interval",
                   "shared_expert_intermediate_size"} | MOE,
})
ACTS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh"}
ROPE_KEYS = {"rope_type", "type", "rope_theta", "factor", "original_max_position_embeddings",
             "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow", "mscale",
             "mscale_all_dim", "attention_factor", "truncate", "partial_rotary_factor"}


def read(config: dict[str, Any], where: str = "config.json") -> dict[str, Any]:
    """ModelConfig's fields from a config.json mapping (a ConfigError naming the first key that is
    refused)."""
    require(isinstance(config, dict), where, type(config).__name__, "must be a JSON object")
    if config.get("model_type") == "gemma3" and isinstance(config.get("text_config"), dict):
        config = {**config["text_config"], "model_type": "gemma3_text"}  # the language model
    family = config.get("model_type") or "llama"  # early LLaMA configs carry none
    _refuse_unmodelled(config, where)
    known = FAMILIES.get(family)
    if known is None:  # an unknown model_type: read as LLaMA only if every key is LLaMA's
        known = FAMILIES["llama"]
        extra = sorted(set(config) - BASE - IGNORED - set(NOT_MODELLED) - known)
        if extra:
            raise ConfigError(f"{where}: model_type", family,
                              f"is not a family seqpar models ({', '.join(FAMILIES)}) and "
                              f"carries {extra[0]}")
        family = "llama"
    extra = sorted(set(config) - BASE - IGNORED - set(NOT_MODELLED) - known)
    if extra:
        raise ConfigError(f"{where}: {extra[0]}", config[extra[0]],
                          f"is not a field seqpar knows for model_type {family} "
                          "(it may change what the model computes)")
    config = with_defaults(config, family)
    out = _base(config, where, family)
    out.update(_attention(config, where, family, out))
    out.update(_feed_forward(config, where, family, out))
    return out


def _refuse_unmodelled(config: dict[str, Any], where: str) -> None:
    for key, why in NOT_MODELLED.items():
        if key in config and config[key] not in NEUTRAL:
            raise ConfigError(f"{where}: {key}", config[key], why)
    kinds = config.get("layer_types") or []
    odd = [k for k in kinds if k not in KINDS]
    require(not odd, f"{where}: layer_types", odd[0] if odd else None,
            f"is a layer kind seqpar does not model ({', '.join(KINDS)})")


def _base(config: dict[str, Any], where: str, family: str) -> dict[str, Any]:
    need = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "intermediate_size"]
    missing = [k for k in need if config.get(k) is None]
    require(not missing, where, missing[0] if missing else None,
            f"is missing (a {family} config.json has {', '.join(need)})")
    heads = config["num_attention_heads"]
    out = {"vocab": config["vocab_size"], "hidden": config["hidden_size"],
           "layers": config["num_hidden_layers"], "heads": heads,
           "kv_heads": config.get("num_key_value_heads") or heads,
           "ffn": config["intermediate_size"], "family": family,
           "tie_embeddings": bool(config.get("tie_word_embeddings", family == "gemma3_text"))}
    if config.get("rms_norm_eps") is not None:
        out["norm_eps"] = config["rms_norm_eps"]
    if config.get("head_dim") is not None:
        out["head_dim"] = config["head_dim"]
    key = "hidden_activation" if family == "gemma3_text" else "hidden_act"
    act = config.get(key) or ("gelu_pytorch_tanh" if family == "gemma3_text" else "silu")
    require(act in ACTS, f"{where}: {key}", act,
            f"is not an activation seqpar models ({', '.join(ACTS)})")
    out["act"] = ACTS[act]
    return out


def _rope_dicts(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(the full layers' RoPE parameters, the sliding layers' or None) in one form, legacy or
    transformers 5's."""
    params = config.get("rope_parameters")
    if isinstance(params, dict) and "full_attention" in params:
        return dict(params["full_attention"]), dict(params.get("sliding_attention") or {}) or None
    if isinstance(params, dict):
        return dict(params), None
    full = dict(config.get("rope_scaling") or {})
    if config.get("rope_theta") is not None:
        full["rope_theta"] = config["rope_theta"]
    local = None
    if config.get("rope_local_base_freq") is not None:
        local = {"rope_type": "default", "rope_theta": config["rope_local_base_freq"]}
    return full, local


def _rope(params: dict[str, Any], config: dict[str, Any], where: str) -> Rope:
    extra = sorted(set(params) - ROPE_KEYS)
    require(not extra, f"{where}: rope_scaling.{extra[0] if extra else ''}",
            params.get(extra[0]) if extra else None, "is not a RoPE parameter seqpar models")
    kind = params.get("rope_type") or params.get("type") or "default"
    require(kind in ("default", "linear", "llama3", "yarn"), f"{where}: rope_scaling.rope_type",
            kind, "is not modelled (default, linear, llama3 and yarn are)")
    # only Qwen3-Next rotates part of a head (the others' references ignore the key): refuse it
    fraction = params.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    require(fraction == 1.0 or config.get("model_type") == "qwen3_next",
            f"{where}: partial_rotary_factor", fraction,
            "is not modelled for this family (its reference rotates the whole head)")
    theta = float(params.get("rope_theta", 10000.0))
    if kind == "default":
        return Rope(theta=theta, fraction=fraction)
    original = params.get("original_max_position_embeddings") or 0
    factor = params.get("factor")
    if factor is None and kind == "yarn" and original:
        factor = config.get("max_position_embeddings", original) / original
    if kind == "yarn" and not original:
        original = config.get("max_position_embeddings") or 0
    rope = Rope(theta=theta, kind=kind, factor=float(factor or 1.0), original_max=original,
                fraction=fraction)
    names = {"low_freq_factor": "low_freq_factor", "high_freq_factor": "high_freq_factor",
             "beta_fast": "beta_fast", "beta_slow": "beta_slow", "mscale": "mscale",
             "mscale_all_dim": "mscale_all_dim", "attention_factor": "attention_factor",
             "truncate": "truncate"}
    got = {ours: params[theirs] for theirs, ours in names.items() if params.get(theirs) is not None}
    return Rope(**{**rope.__dict__, **got})


def _attention(config: dict[str, Any], where: str, family: str,
               base: dict[str, Any]) -> dict[str, Any]:
    full, local = _rope_dicts(config)
    rope = _rope(full, config, where)
    out: dict[str, Any] = {"rope": rope, "rope_theta": rope.theta}
    if local is not None:
        loc = _rope(local, config, where)
        require(loc.kind == "default" and loc.fraction == rope.fraction,
                f"{where}: rope_parameters.sliding_attention", local,
                "must be default RoPE (a sliding layer's own base, as Gemma 3's)")
        if loc.theta != rope.theta or rope.kind != "default":
            out["local_rope_theta"] = loc.theta
    layers = base["layers"]
    window = config.get("sliding_window")
    kinds = [KINDS[k] for k in (config.get("layer_types") or [])]
    if not kinds:
        kinds = _default_kinds(config, family, layers, window)
    if family in WINDOW_SWITCH and not config.get("use_sliding_window"):
        kinds = ["full" if k == "sliding" else k for k in kinds]  # the reference's window: None
    require(len(kinds) == layers, f"{where}: layer_types", len(kinds),
            f"must name one kind per layer (num_hidden_layers {layers})")
    require("linear" not in kinds or family == "qwen3_next", f"{where}: layer_types",
            "linear_attention", f"is not a layer kind of model_type {family}")
    if "sliding" in kinds:
        require(isinstance(window, int) and window > 0, f"{where}: sliding_window", window,
                "must be a positive integer where a layer is sliding_attention")
        out["window"] = window
    out["layer_types"] = tuple(kinds)
    bias = bool(config.get("attention_bias", False))
    out["qkv_bias"] = bias or family == "qwen2" or family == "gpt_oss"
    out["o_bias"] = bias or family == "gpt_oss"
    out["qk_norm"] = family in ("qwen3", "qwen3_moe", "gemma3_text")
    out["sinks"] = family == "gpt_oss"
    if family == "gemma3_text":
        out.update(norm_offset=True, sandwich_norms=True, embed_scale=True,
                   attn_scale=float(config.get("query_pre_attn_scalar", 256)) ** -0.5)
    if family in ("deepseek_v2", "deepseek_v3", "kimi_k2"):
        out.update(_latent(config, rope))
    if family == "qwen3_next":
        out.update(qk_norm=True, norm_offset=True, attn_gate=True,
                   lin_k_heads=config["linear_num_key_heads"],
                   lin_v_heads=config["linear_num_value_heads"],
                   lin_k_dim=config["linear_key_head_dim"],
                   lin_v_dim=config["linear_value_head_dim"],
                   conv_kernel=config["linear_conv_kernel_dim"])
    if family == "smollm3":  # 1: the layer rotates; by default every 4th does not
        every = config.get("no_rope_layer_interval") or 4
        flags = config.get("no_rope_layers") or [int((i + 1) % every != 0) for i in range(layers)]
        require(len(flags) == layers, f"{where}: no_rope_layers", len(flags),
                f"must hold one flag per layer ({layers})")
        out["nope_layers"] = tuple(i for i, use in enumerate(flags) if not use)
    return out


def _latent(config: dict[str, Any], rope: Rope) -> dict[str, Any]:
    """Multi-head latent attention's fields; its softmax scale is qk_head_dim^-1/2 times YaRN's
    mscale(factor, mscale_all_dim) squared, as DeepSeek's reference scales it."""
    nope, rot = config["qk_nope_head_dim"], config["qk_rope_head_dim"]
    out = {"q_lora_rank": config.get("q_lora_rank") or 0, "kv_lora_rank": config["kv_lora_rank"],
           "qk_rope_dim": rot, "head_dim": nope + rot, "v_head_dim": config["v_head_dim"],
           "rope_interleave": bool(config.get("rope_interleave", True))}
    scale = (nope + rot) ** -0.5
    if rope.kind == "yarn" and rope.mscale_all_dim and rope.factor > 1:
        scale *= (0.1 * rope.mscale_all_dim * math.log(rope.factor) + 1.0) ** 2
    out["attn_scale"] = scale
    return out


def _default_kinds(config: dict[str, Any], family: str, layers: int,
                   window: int | None) -> list[str]:
    if family == "gemma3_text":
        every = config.get("sliding_window_pattern") or config.get("_sliding_window_pattern") or 6
        return ["sliding" if (i + 1) % every else "full" for i in range(layers)]
    if family == "gpt_oss":
        return ["sliding" if (i + 1) % 2 else "full" for i in range(layers)]
    if family in ("mistral", "mixtral"):
        return ["sliding" if window else "full"] * layers
    if family == "qwen3_next":
        every = config.get("full_attention_interval") or 4
        return ["linear" if (i + 1) % every else "full" for i in range(layers)]
    if family in ("qwen2", "qwen3", "qwen3_moe", "smollm3") and config.get("use_sliding_window"):
        first = config.get("max_window_layers", layers)
        return ["sliding" if window and i >= first else "full" for i in range(layers)]
    return ["full"] * layers


def _feed_forward(config: dict[str, Any], where: str, family: str,
                  base: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"mlp_bias": bool(config.get("mlp_bias", False))}
    experts = (config.get("num_local_experts") or config.get("num_experts")
               or config.get("n_routed_experts") or 0)
    if family in ("llama", "mistral", "qwen2", "qwen3", "smollm3", "gemma3_text") or not experts:
        return out
    layers = base["layers"]
    out.update(experts=experts, experts_per_tok=config.get("num_experts_per_tok") or 0)
    if family in ("deepseek_v2", "deepseek_v3", "kimi_k2"):
        out.update(_deepseek_moe(config, where, layers))
    elif family in ("qwen3_moe", "qwen3_next"):
        step = config.get("decoder_sparse_step") or 1
        dense = set(config.get("mlp_only_layers") or [])
        out["moe_layers"] = tuple(i for i in range(layers)
                                  if i not in dense and (i + 1) % step == 0)
        out["moe_ffn"] = config.get("moe_intermediate_size") or base["ffn"]
        out["norm_topk"] = bool(config.get("norm_topk_prob", False))
        if config.get("shared_expert_intermediate_size"):  # Qwen3-Next's gated shared expert
            out.update(shared_ffn=config["shared_expert_intermediate_size"], shared_gate=True)
    else:
        out["moe_ffn"] = base["ffn"]
    if family == "gpt_oss":
        alias = config.get("experts_per_token", out["experts_per_tok"])  # OpenAI's own name
        require(alias == out["experts_per_tok"], f"{where}: experts_per_token", alias,
                f"must equal num_experts_per_tok ({out['experts_per_tok']})")
        alpha = config.get("swiglu_alpha", 1.702)
        require(alpha == 1.702, f"{where}: swiglu_alpha", alpha,
                "must be 1.702 (gpt-oss's clamped SwiGLU)")
        out.update(act="swiglu_oai", swiglu_limit=float(config.get("swiglu_limit", 7.0)),
                   router="topk_softmax", router_bias=True, expert_bias=True)
    if config.get("output_router_logits"):
        out["aux_loss_coef"] = float(config.get("router_aux_loss_coef", 0.001))
    return out


def _deepseek_moe(config: dict[str, Any], where: str, layers: int) -> dict[str, Any]:
    """DeepSeek's MoE: dense first layers, then every moe_layer_freq-th; shared experts; V3's
    sigmoid scores with group-limited top-k (noaux_tc), V2's softmax (greedy)."""
    first, freq = config.get("first_k_dense_replace") or 0, config.get("moe_layer_freq") or 1
    ffn = config["moe_intermediate_size"]
    out: dict[str, Any] = {
        "moe_layers": tuple(i for i in range(layers) if i >= first and i % freq == 0),
        "moe_ffn": ffn, "shared_ffn": (config.get("n_shared_experts") or 0) * ffn,
        "norm_topk": bool(config.get("norm_topk_prob", False)),
        "routed_scale": float(config.get("routed_scaling_factor") or 1.0)}
    method = config.get("topk_method") or "noaux_tc"
    if method == "noaux_tc":
        score = config.get("scoring_func") or "sigmoid"
        require(score == "sigmoid", f"{where}: scoring_func", score,
                "must be sigmoid with topk_method noaux_tc (DeepSeek-V3)")
        out.update(router="sigmoid_group", n_group=config.get("n_group") or 1,
                   topk_group=config.get("topk_group") or 1)
    else:
        require(method == "greedy", f"{where}: topk_method", method,
                "is not modelled (noaux_tc and greedy are)")
    return out
