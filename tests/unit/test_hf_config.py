"""config.json read field by field: every family's keys modelled, ignored or refused by name, and
the RoPE frequencies the reference computes."""

from __future__ import annotations

import json
import random

import pytest

from seqpar.errors import ConfigError
from seqpar.rules import hf_config
from seqpar.rules.model import ModelConfig, from_hf, load
from seqpar.rules.rope import Rope, attention_factor, inv_freq

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
RNG = random.Random()

FAMILY_CONFIGS = {"llama": "LlamaConfig", "mistral": "MistralConfig", "qwen2": "Qwen2Config",
                  "qwen3": "Qwen3Config", "smollm3": "SmolLM3Config",
                  "gemma3_text": "Gemma3TextConfig", "gpt_oss": "GptOssConfig",
                  "mixtral": "MixtralConfig", "qwen3_moe": "Qwen3MoeConfig"}


def _saved(name: str, **kw) -> dict:
    """The config.json transformers writes for its config class `name`."""
    return json.loads(getattr(transformers, name)(**kw).to_json_string())


@pytest.mark.parametrize("family", sorted(FAMILY_CONFIGS))
def test_every_family_config_reads_with_its_shape(family):
    cfg = from_hf(_saved(FAMILY_CONFIGS[family]))
    ref = getattr(transformers, FAMILY_CONFIGS[family])()
    assert cfg.family == family and cfg.layers == ref.num_hidden_layers
    assert cfg.head_dim == (getattr(ref, "head_dim", None)
                            or ref.hidden_size // ref.num_attention_heads)
    kinds = [{"full_attention": "full", "sliding_attention": "sliding"}[k]
             for k in (getattr(ref, "layer_types", None) or [])]
    if kinds:  # the reference's own per-layer kinds
        assert list(cfg.layer_types) == kinds
    assert cfg.params() >= cfg.active_params() > 0


def test_the_families_traits_are_modelled_not_dropped():
    assert from_hf(_saved("Qwen2Config")).qkv_bias and not from_hf(_saved("Qwen2Config")).o_bias
    q3 = from_hf(_saved("Qwen3Config", head_dim=96, tie_word_embeddings=True))
    assert q3.qk_norm and q3.head_dim == 96 and q3.tie_embeddings
    assert "head" not in __import__("seqpar.rules.model", fromlist=["x"]).param_shapes(q3)
    g = from_hf(_saved("Gemma3TextConfig", num_hidden_layers=12, query_pre_attn_scalar=168))
    assert g.layer_types == ("sliding",) * 5 + ("full",) + ("sliding",) * 5 + ("full",)
    assert g.norm_offset and g.sandwich_norms and g.embed_scale and g.tie_embeddings
    assert g.attn_scale == pytest.approx(168 ** -0.5) and g.act == "gelu_tanh"
    assert g.local_rope_theta == 10000.0 and g.rope.theta == 1_000_000.0
    oss = from_hf(_saved("GptOssConfig"))
    assert oss.sinks and oss.act == "swiglu_oai" and oss.router == "topk_softmax"
    assert oss.rope.kind == "yarn" and oss.window == 128 and oss.layer_types[:2] == ("sliding", "full")
    moe = from_hf(_saved("Qwen3MoeConfig", num_hidden_layers=6, decoder_sparse_step=2,
                         mlp_only_layers=[3]))
    assert moe.moe_layers == (1, 5) and moe.experts == 128


def test_legacy_keys_and_rope_parameters_read_alike():
    legacy = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
              "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
              "vocab_size": 100, "rope_theta": 500000.0,
              "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 8192}}
    new = {k: v for k, v in legacy.items() if k not in ("rope_theta", "rope_scaling")}
    new["rope_parameters"] = {**legacy["rope_scaling"], "rope_theta": 500000.0}
    assert from_hf(legacy) == from_hf(new)
    assert from_hf(legacy).rope.kind == "llama3" and from_hf(legacy).rope.factor == 8.0


@pytest.mark.parametrize(("key", "value", "words"), [
    ("kv_lora_rank", 512, "is not a field seqpar knows for model_type qwen3"),
    ("linear_num_value_heads", 32, "is not a field seqpar knows for model_type qwen3"),
    ("ssm_state_size", 16, "state-space (Mamba)"),
    ("final_logit_softcapping", 30.0, "soft-capping"),
    ("attention_chunk_size", 8192, "chunked attention"),
    ("attention_dropout", 0.1, "dropout"),
    ("mamba_expand", 2, "is not a field seqpar knows for model_type qwen3")])
def test_a_field_that_changes_the_function_is_refused_by_name(key, value, words):
    data = {**_saved("Qwen3Config"), key: value}
    with pytest.raises(ConfigError) as err:
        from_hf(data)
    text = str(err.value)
    assert f"config.json: {key}={value!r}" in text.replace(f"'{value}'", repr(value)) or key in text
    assert words in text and "\n" not in text


def test_neutral_values_of_unmodelled_keys_pass():
    data = {**_saved("Gemma3TextConfig"), "attn_logit_softcapping": None,
            "final_logit_softcapping": None, "attention_dropout": 0.0}
    assert from_hf(data).family == "gemma3_text"


def test_an_unknown_model_type_is_read_as_llama_only_with_llamas_keys():
    plain = {**_saved("LlamaConfig"), "model_type": "my_llama_finetune"}
    assert from_hf(plain).family == "llama"
    with pytest.raises(ConfigError, match="model_type='my_hybrid': is not a family"):
        from_hf({**plain, "model_type": "my_hybrid", "mixer_kind": "mamba"})


def test_layer_types_of_the_wrong_length_and_an_unknown_kind_are_refused():
    data = _saved("Qwen3Config", num_hidden_layers=4)
    with pytest.raises(ConfigError, match="layer_types=3: must name one kind per layer"):
        from_hf({**data, "layer_types": ["full_attention"] * 3})
    with pytest.raises(ConfigError, match="linear_attention'?: is not a layer kind of model_type"):
        from_hf({**data, "layer_types": ["linear_attention"] * 4})
    with pytest.raises(ConfigError, match="mamba"):
        from_hf({**data, "layer_types": ["mamba"] * 4})


def test_a_preset_name_or_a_missing_file_is_told_apart(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load(str(tmp_path / "nope" / "config.json"))
    with pytest.raises(ConfigError, match="must be one of"):
        load("llama9")


def _reference_freqs(config) -> tuple[list[float], float]:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config.standardize_rope_params()
    kind = config.rope_parameters["rope_type"]
    init = (transformers.models.llama.modeling_llama.LlamaRotaryEmbedding
            .compute_default_rope_parameters if kind == "default" else ROPE_INIT_FUNCTIONS[kind])
    freqs, factor = init(config) if kind == "default" else init(config, "cpu")
    return freqs.tolist(), float(factor)


@pytest.mark.parametrize("kind", ["default", "linear", "llama3", "yarn", "yarn-deepseek"])
def test_rope_frequencies_equal_the_references(kind):
    theta = RNG.choice([10000.0, 500000.0, 1e6])
    head_dim = RNG.choice([64, 128])
    params = {"rope_theta": theta}
    if kind == "linear":
        params.update(rope_type="linear", factor=RNG.choice([2.0, 8.0]))
    elif kind == "llama3":
        params.update(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                      original_max_position_embeddings=8192)
    elif kind == "yarn":
        params.update(rope_type="yarn", factor=32.0, beta_fast=32.0, beta_slow=1.0,
                      truncate=RNG.choice([True, False]), original_max_position_embeddings=4096)
    elif kind == "yarn-deepseek":
        params.update(rope_type="yarn", factor=40.0, mscale=1.0, mscale_all_dim=1.0,
                      original_max_position_embeddings=4096)
    else:
        params.update(rope_type="default")
    ref = transformers.LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4,
                                   head_dim=head_dim, max_position_embeddings=131072,
                                   rope_parameters=dict(params))
    want, want_factor = _reference_freqs(ref)
    cfg = from_hf(json.loads(ref.to_json_string()))
    got = inv_freq(cfg.rope, cfg.head_dim)
    assert len(got) == len(want)
    assert got == pytest.approx(want, rel=1e-5)  # the reference computes in float32 (2e-6 seen)
    assert attention_factor(cfg.rope) == pytest.approx(want_factor, rel=1e-6)


def test_a_rope_kind_seqpar_does_not_model_is_refused():
    data = _saved("LlamaConfig", rope_parameters={"rope_type": "dynamic", "factor": 2.0,
                                                    "rope_theta": 10000.0})
    with pytest.raises(ConfigError, match="rope_type='dynamic': is not modelled"):
        from_hf(data)
    with pytest.raises(ConfigError, match="rope.kind"):
        Rope(kind="longrope")
    with pytest.raises(ConfigError, match="partial_rotary_factor=0.5: is not"):
        from_hf({**_saved("LlamaConfig"), "partial_rotary_factor": 0.5})


def test_every_ignored_key_is_one_that_cannot_change_the_function():
    # a guard on the list itself: nothing architectural hides among the ignored keys
    architectural = {"hidden_size", "num_hidden_layers", "head_dim", "sliding_window",
                     "rope_theta", "rope_scaling", "tie_word_embeddings", "attention_bias"}
    assert not architectural & hf_config.IGNORED
    assert ModelConfig(vocab=10, hidden=8, layers=1, heads=2, kv_heads=1, ffn=8).head_dim == 4


@pytest.mark.parametrize("family", sorted(set(FAMILY_CONFIGS) | {"deepseek_v3", "qwen3_next"}))
def test_the_defaults_of_a_key_left_out_are_the_references(family):
    from seqpar.rules.hf_defaults import DEFAULTS

    names = {**FAMILY_CONFIGS, "deepseek_v3": "DeepseekV3Config", "qwen3_next": "Qwen3NextConfig"}
    ref = getattr(transformers, names[family])()
    rope = ref.rope_parameters
    rope = rope.get("full_attention", rope)
    for key, value in DEFAULTS[family].items():
        if key == "rope_theta":
            assert rope["rope_theta"] == value, key
        elif key == "rope_scaling":
            assert {k: rope[k] for k in value} == value
        elif key in ("rope_local_base_freq", "partial_rotary_factor"):
            local = ref.rope_parameters.get("sliding_attention", ref.rope_parameters)
            assert local.get("rope_theta" if key == "rope_local_base_freq" else key) == value
        elif not (key == "sliding_window" and not getattr(ref, "use_sliding_window", True)):
            assert getattr(ref, key) == value, key  # (Qwen's unused window reads None there)
    # a config that leaves everything but its dimensions out reads as the reference's defaults
    dims = ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers")
    bare = {"model_type": ref.model_type, **{k: getattr(ref, k) for k in dims}}
    if family in ("deepseek_v3",):
        bare.update({k: getattr(ref, k) for k in ("kv_lora_rank", "q_lora_rank",
                     "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_routed_experts",
                     "moe_intermediate_size")})
    if family == "qwen3_next":
        bare.update({k: getattr(ref, k) for k in ("linear_num_key_heads", "linear_num_value_heads",
                     "linear_key_head_dim", "linear_value_head_dim", "num_experts",
                     "moe_intermediate_size", "shared_expert_intermediate_size")})
    if family in ("mixtral", "gpt_oss", "qwen3_moe"):
        bare["num_local_experts" if family != "qwen3_moe" else "num_experts"] = \
            getattr(ref, "num_local_experts", None) or ref.num_experts
    if family in ("deepseek_v3", "qwen3_next"):
        pytest.skip("read, refused until the torch decoder computes it") if any(
            k in hf_config.NOT_MODELLED for k in ("kv_lora_rank", "linear_num_value_heads")
            if k in bare) else None
    full = json.loads(ref.to_json_string())
    assert from_hf(bare) == from_hf(full)
