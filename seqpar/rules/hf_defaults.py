"""What each family's config class assumes for a key its config.json leaves out.

Published config.json files rely on these (Gemma 3's text_config names ten keys; vocab_size,
rms_norm_eps, the RoPE bases, the window pattern come from the class), and the defaults differ by
family (rms_norm_eps 1e-6 for Llama, 1e-5 for Mixtral and gpt-oss; rope_theta 1e6 for Mixtral,
150,000 and YaRN for gpt-oss): a key left out reads as the family's reference reads it. Transcribed
from transformers 5's configuration classes (`LlamaConfig`, `Gemma3TextConfig`, ...); a test holds
the table to them.
"""

from __future__ import annotations

from typing import Any

_SILU = {"hidden_act": "silu", "tie_word_embeddings": False, "rms_norm_eps": 1e-6,
         "rope_theta": 10000.0}
_QWEN = {**_SILU, "vocab_size": 151936, "num_key_value_heads": 32, "use_sliding_window": False,
         "sliding_window": 4096, "max_window_layers": 28}

DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {**_SILU, "vocab_size": 32000, "attention_bias": False, "mlp_bias": False},
    "mistral": {**_SILU, "vocab_size": 32000, "num_key_value_heads": 8, "sliding_window": 4096},
    "qwen2": dict(_QWEN),
    "qwen3": {**_QWEN, "head_dim": 128, "attention_bias": False},
    "smollm3": {**_SILU, "vocab_size": 128256, "num_key_value_heads": 4, "rope_theta": 2_000_000.0,
                "tie_word_embeddings": True, "use_sliding_window": False,
                "attention_bias": False, "mlp_bias": False},
    "gemma3_text": {"vocab_size": 262208, "head_dim": 256, "num_key_value_heads": 4,
                    "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6,
                    "tie_word_embeddings": True, "attention_bias": False,
                    "query_pre_attn_scalar": 256, "sliding_window": 4096,
                    "rope_theta": 1_000_000.0, "rope_local_base_freq": 10000.0},
    "gpt_oss": {**_SILU, "vocab_size": 201088, "head_dim": 64, "num_key_value_heads": 8,
                "sliding_window": 128, "rms_norm_eps": 1e-5, "num_experts_per_tok": 4,
                "swiglu_limit": 7.0, "attention_bias": True, "rope_theta": 150000.0,
                "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                                 "beta_slow": 1.0, "truncate": False,
                                 "original_max_position_embeddings": 4096}},
    "mixtral": {**_SILU, "vocab_size": 32000, "num_key_value_heads": 8, "rms_norm_eps": 1e-5,
                "rope_theta": 1_000_000.0, "sliding_window": None, "num_experts_per_tok": 2},
    "qwen3_moe": {**{k: v for k, v in _QWEN.items() if k != "max_window_layers"},
                  "attention_bias": False, "num_key_value_heads": 4,
                  "moe_intermediate_size": 768, "decoder_sparse_step": 1,
                  "num_experts_per_tok": 8, "norm_topk_prob": False},
    "deepseek_v2": {**_SILU, "vocab_size": 102400, "first_k_dense_replace": 0,
                    "n_shared_experts": 2, "routed_scaling_factor": 1.0, "topk_method": "greedy",
                    "norm_topk_prob": False, "attention_bias": False},
    "deepseek_v3": {**_SILU, "vocab_size": 129280, "num_key_value_heads": 128,
                    "moe_intermediate_size": 2048, "n_shared_experts": 1,
                    "routed_scaling_factor": 2.5, "n_group": 8, "topk_group": 4,
                    "num_experts_per_tok": 8, "first_k_dense_replace": 3, "norm_topk_prob": True,
                    "rope_interleave": True, "attention_bias": False},
    "qwen3_next": {**_SILU, "vocab_size": 151936, "head_dim": 256, "num_key_value_heads": 2,
                   "attention_bias": False, "moe_intermediate_size": 512,
                   "linear_conv_kernel_dim": 4,
                   "decoder_sparse_step": 1, "num_experts_per_tok": 10, "norm_topk_prob": True,
                   "partial_rotary_factor": 0.25},
}
DEFAULTS["kimi_k2"] = DEFAULTS["deepseek_v3"]


def with_defaults(config: dict[str, Any], family: str) -> dict[str, Any]:
    """`config` with its family's defaults under the keys it leaves out. A config in
    transformers 5's form (rope_parameters) keeps its own RoPE: the legacy RoPE defaults stay out."""
    base = dict(DEFAULTS.get(family, {}))
    if "rope_parameters" in config:
        for key in ("rope_theta", "rope_scaling", "rope_local_base_freq", "partial_rotary_factor"):
            base.pop(key, None)
    return {**base, **config}
