"""What a sweep need not repeat: a training trial's attention shape is its model's (a preset, a
YAML or a config.json: `train.model` already says it), and a step of lengths holds, unless told
otherwise, the longest sequence its distribution gives. Each default is the spec a user would have
written in full: the same hash, the same trial."""

from __future__ import annotations

import json

import pytest

from seqpar.errors import ConfigError
from seqpar.experiments.spec import ExperimentSpec
from seqpar.rules.model import ModelConfig
from seqpar.sweeps import spec as sweep_spec

LOGNORMAL = "lognormal:mean=160,sigma=1.2,min=32,max=1024"


def _train(model: str, **workload) -> dict:
    return {"plan": {"algorithm": "ring", "world": 2},
            "workload": {"seq_len": 512, **workload}, "train": {"model": model}}


def _config_json(tmp_path) -> str:
    hf = {"model_type": "llama", "hidden_size": 384, "intermediate_size": 768,
          "num_attention_heads": 6, "num_key_value_heads": 2, "num_hidden_layers": 2,
          "vocab_size": 1000}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(hf))
    return str(path)


@pytest.mark.parametrize("model", ["tiny", "llama3.1-8b", "config.json"])
def test_a_training_trial_takes_its_models_attention_shape(tmp_path, model):
    name = _config_json(tmp_path) if model == "config.json" else model
    cfg = ModelConfig.load(name)
    shape = {"heads": cfg.heads, "kv_heads": cfg.kv_heads, "head_dim": cfg.head_dim}
    short = ExperimentSpec.parse(_train(name))
    full = ExperimentSpec.parse({**_train(name), "model": shape})
    assert (short.model.heads, short.model.hkv, short.model.head_dim) == tuple(shape.values())
    assert short.hash == full.hash and short.to_case() == full.to_case()


def test_a_model_section_that_disagrees_is_refused_and_says_it_may_go():
    with pytest.raises(ConfigError) as err:  # the attention preset tiny is 8/8/32; the model 4/2/16
        ExperimentSpec.parse({**_train("tiny"), "model": "tiny"})
    assert err.value.field == "model.shape" and err.value.rule.endswith("or left out")


def test_an_unknown_train_model_is_one_line_naming_train_model():
    with pytest.raises(ConfigError) as err:
        ExperimentSpec.parse(_train("no-such-model.json"))
    assert (err.value.field, err.value.value) == ("train.model", "no-such-model.json")
    assert "no such file" in err.value.rule


def test_a_step_of_lengths_holds_the_longest_sequence_they_give():
    short = ExperimentSpec.parse({**_train("tiny"), "workload": {
        "lengths": LOGNORMAL, "tokens_per_step": 4096}})
    full = ExperimentSpec.parse({**_train("tiny"), "workload": {
        "lengths": LOGNORMAL, "tokens_per_step": 4096, "seq_len": 1024}})
    assert short.workload.seq_len == 1024 and short.hash == full.hash
    fixed = ExperimentSpec.parse({**_train("tiny"), "workload": {"lengths": "fixed:300"}})
    assert fixed.workload.seq_len == 300
    with pytest.raises(ConfigError) as err:  # without lengths, N is still the user's to say
        ExperimentSpec.parse({**_train("tiny"), "workload": {"batch": 1}})
    assert (err.value.field, err.value.rule) == ("workload.seq_len", "is required")
    with pytest.raises(ConfigError) as err:  # a bad distribution is named as before
        ExperimentSpec.parse({**_train("tiny"), "workload": {"lengths": "gamma:3"}})
    assert err.value.field == "workload.lengths"


def test_the_manuals_sweep_of_lengths_runs_as_written():
    """docs/lengths.md's sweep: no model section, no seq_len."""
    plan = sweep_spec.parse({"base": {
        "plan": {"algorithm": "ring", "world": 2, "capacity": 512},
        "workload": {"lengths": LOGNORMAL, "tokens_per_step": 4096, "batches": 2},
        "train": {"model": "tiny"}}, "grid": {"plan.sp_policy": ["static", "dynamic"]}})
    plan.check(strict=True)
    assert len(plan.trials) == 2
    assert {p.spec.workload.seq_len for p in plan.trials} == {1024}
