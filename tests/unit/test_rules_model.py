"""The torch-free floor of the model: one loader (preset, YAML, Hugging Face config.json), FLOPs in
one convention, the memory a policy predicts (offload, tiling) and that none of it imports torch."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest
import yaml

from seqpar.errors import ConfigError
from seqpar.rules import flops
from seqpar.rules import memory as rm
from seqpar.rules.model import ModelConfig, load, param_shapes, preset_names

RNG = random.Random()


def _random_cfg() -> dict:
    heads = RNG.choice([4, 8, 16])
    return {"vocab": RNG.randrange(100, 5000), "hidden": heads * 2 * RNG.randrange(4, 33),
            "layers": RNG.randrange(1, 6), "heads": heads,
            "kv_heads": RNG.choice([h for h in (1, 2, 4, heads) if heads % h == 0]),
            "ffn": RNG.randrange(64, 4096)}


def test_a_yaml_and_a_hugging_face_config_load_as_the_same_model(tmp_path):
    fields = _random_cfg()
    (tmp_path / "m.yaml").write_text(yaml.safe_dump({**fields, "source": "drawn"}))
    hf = {"model_type": "llama", "hidden_size": fields["hidden"], "vocab_size": fields["vocab"],
          "intermediate_size": fields["ffn"], "num_attention_heads": fields["heads"],
          "num_key_value_heads": fields["kv_heads"], "num_hidden_layers": fields["layers"],
          "rope_theta": 500000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
          "head_dim": fields["hidden"] // fields["heads"], "sliding_window": None}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    a, b = ModelConfig.load(str(tmp_path / "m.yaml")), load(tmp_path / "config.json")
    assert a == ModelConfig(**fields)
    assert b == ModelConfig(**fields, rope_theta=500000.0, norm_eps=1e-6)
    assert a.params() == sum(n for s in param_shapes(a).values() for n in [_numel(s)])


def _numel(shape: tuple[int, ...]) -> int:
    out = 1
    for n in shape:
        out *= n
    return out


def test_the_presets_are_files_and_the_published_sizes():
    names = preset_names()
    assert names == sorted(names) and {"llama3.1-8b", "llama3.1-70b", "qwen2.5-14b"} <= set(names)
    sizes = {n: load(n).params() / 1e9 for n in ("llama3.1-8b", "llama3.1-70b", "qwen2.5-14b")}
    assert sizes["llama3.1-8b"] == pytest.approx(8.03, abs=0.01)  # the model cards' counts
    assert sizes["llama3.1-70b"] == pytest.approx(70.55, abs=0.01)
    assert sizes["qwen2.5-14b"] == pytest.approx(14.77, abs=0.01)
    with pytest.raises(ConfigError) as err:
        load("llama9")
    assert str(err.value).startswith(f"model='llama9': must be one of {', '.join(names)},")


@pytest.mark.parametrize(("key", "value", "rule"), [
    ("attn_logit_softcapping", 50.0, "soft-capping (Gemma 2) is not modelled"),
    ("ssm_state_size", 16, "state-space (Mamba) layers are not modelled"),
    ("kv_lora_rank", 512, "is not a field seqpar knows for model_type llama"),
    ("frobnicate", 3, "is not a field seqpar knows for model_type llama"),
    ("layer_types", ["full_attention"], "must name one kind per layer"),
    ("num_attention_heads", None, "is missing")])
def test_a_config_json_field_that_is_not_modelled_is_refused_by_name(tmp_path, key, value, rule):
    hf = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1024,
          "num_attention_heads": 8, "num_key_value_heads": 2, "num_hidden_layers": 2,
          "vocab_size": 1000, key: value}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(hf))
    with pytest.raises(ConfigError) as err:
        load(str(path))
    assert rule in str(err.value) and "\n" not in str(err.value) and key in str(err.value)


def test_one_attention_flop_convention_and_the_dense_one_derived_from_it():
    assert flops.BACKWARD_FLOPS == 2.5 and flops.MODEL_BACKWARD_FLOPS == 2.0
    cfg = load("llama3.1-8b")
    n = RNG.choice([4096, 32768, 131072])
    # torchtitan / Megatron: 6 x non-embedding params + 12 x layers x hidden x N, per token
    titan = (6 * (cfg.params() - cfg.vocab * cfg.hidden) + 12 * cfg.layers * cfg.hidden * n) * n
    assert flops.step_flops(cfg, 1, n, float(n) ** 2) == pytest.approx(titan, rel=1e-12)
    attn = cfg.layers * 4.0 * n * n * cfg.hidden / 2  # causal forward
    assert flops.step_flops(cfg, 1, n) - 6 * flops.dense_params(cfg) * n == \
        pytest.approx(3 * attn, rel=1e-12)  # mfu's: by area, backward 2x
    assert flops.step_flops(cfg, 1, n, backward=flops.BACKWARD_FLOPS) - \
        6 * flops.dense_params(cfg) * n == pytest.approx(3.5 * attn, rel=1e-12)  # the kernels'


def test_offload_moves_states_to_the_host_and_keeps_their_sum():
    cfg = ModelConfig(**_random_cfg())
    shards = RNG.choice([1, 2, 8])
    total = None
    for offload in ((), ("params",), ("optimizer", "params"), True):
        p = rm.TrainPolicy(states="fsdp", master_dtype="float32", offload=offload)
        s = rm.predicted_states(cfg, "bfloat16", p, shards)
        total = total or s["device"]
        assert s["device"] + s["host"] == total
        if "params" in p.offload:  # FSDP2's CPU offload: every state steps on the host
            assert s["host"] == total and s["device"] == 0
    assert rm.TrainPolicy(states="fsdp", offload=True).offload == ("optimizer", "params")
    for bad in (("disk",), ("optimizer",)):  # 'optimizer' lives beside the params it updates
        with pytest.raises(ConfigError):
            rm.TrainPolicy(states="fsdp", offload=bad)
    with pytest.raises(ConfigError, match="'params' needs states='fsdp'"):
        rm.TrainPolicy(offload=("params",))


@pytest.mark.parametrize("mode", rm.CHECKPOINT_MODES)
def test_tiling_and_activation_offload_only_ever_lower_memory(mode):
    cfg = load("llama3.1-8b")
    s = RNG.choice([8192, 32768, 131072])
    held = rm.AttentionHeld(saved=1.5 * cfg.hidden, recomputable=1.5 * cfg.hidden)

    def mem(**kw):
        p = rm.TrainPolicy(checkpoint=mode, **kw)
        return (rm.predicted_activations(cfg, 1, s, "bfloat16", p, held),
                rm.block_working_set(cfg, 1, s, "bfloat16", p, held))

    plain, tiled = mem(), mem(tiled=True)
    offloaded = mem(offload=("activations",))
    assert tiled[0] <= plain[0] and offloaded[0] < plain[0]
    if mode != "none":  # the recompute's MLP exists one tile (hidden tokens) at a time
        assert tiled[1] <= plain[1]
        ffn = 4 * cfg.ffn * 2
        full = mode in ("full", "sc++", "seq-attn")
        assert plain[1] - tiled[1] == pytest.approx(
            ffn * (s * (1 if full else 0.5) - min(s, cfg.hidden)), rel=1e-9)


def test_the_rules_import_no_torch():
    code = ("import sys; import seqpar.rules.model, seqpar.rules.memory, seqpar.rules.flops; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "False"
