"""A family's softmax layers are LLaMA's block plus what each of its features adds
(`rules.ops.layer_features`, `feature_deltas`), chosen in `planner.host.micro_issue` from the model
config: Qwen3's QK-norm, Gemma 3's norms, gpt-oss's biases, SwiGLU and sinks, Qwen3-Next's gated
full layer; a LLaMA model's blocks as before."""

from __future__ import annotations

import dataclasses

import pytest

from seqpar.planner import host
from seqpar.rules import ops
from seqpar.rules.memory import CHECKPOINT_MODES
from seqpar.rules.model import load

RING = {"algorithm": "ring", "d": 4, "layout": "zigzag", "options": {}}


def _moved(cfg, base, checkpoint: str = "none") -> list[tuple[ops.Issue, str]]:
    """micro_issue's parts for `cfg` less `base`'s, with their phases, where they differ (the two
    models' parts in the same order)."""
    got, was = (host.micro_issue(c, **RING, checkpoint=checkpoint, seq_len=4096)
                for c in (cfg, base))
    assert len(got) == len(was)
    return [(a + b * -1.0, ph) for (a, ph), (b, _) in zip(got, was, strict=True) if a != b]


@pytest.mark.parametrize(("model", "features"), [
    ("tiny-qwen3", ("qk_norm",)),
    ("tiny-qwen3-moe", ("qk_norm",)),  # its experts counted as a dense feed-forward
    ("tiny-gemma3", ("qk_norm", "sandwich_norms", "norm_offset", "gelu_tanh")),
    ("tiny-gpt-oss", ("qkv_bias", "o_bias", "swiglu_oai", "sinks")),
])
def test_a_familys_layers_issue_llamas_block_plus_its_features(model, features):
    cfg, llama = load(model), load("tiny")
    assert {ops.layer_features(cfg, i) for i in range(cfg.layers)} == {features}
    twin = dataclasses.replace(llama, layers=cfg.layers, layer_types=())  # same layers, LLaMA's
    for checkpoint in ("none", "full"):
        moved = _moved(cfg, twin, checkpoint)
        assert [ph for _, ph in moved] == list(ops.PHASES)  # the blocks alone, forward and backward
        for delta, phase in moved:
            want = ops.feature_deltas(features, checkpoint, phase)
            assert want.ops > 0 and delta == want * cfg.layers, (model, checkpoint, phase)


def test_gemmas_norms_cost_more_per_norm_than_llamas():
    """Gemma's (1 + w) norms in float32 cost more than LLaMA's per norm, so QK-norm's and the
    sandwich norms' rows over them are dearer: the features do not add alone."""
    for name in ("qk_norm", "sandwich_norms", "attn_gate"):
        over = ops.table()["features"][f"{name}|none"]
        assert over["norm_offset"]["forward"]["ops"] > over["llama"]["forward"]["ops"]
    assert ops.feature_deltas(("qk_norm", "norm_offset")).ops > (
        ops.feature_deltas(("qk_norm",)).ops + ops.feature_deltas(("norm_offset",)).ops)


def test_a_hybrids_full_layer_is_qwen3_nexts_gated_layer():
    cfg = load("kinds-hybrid")
    assert host.feature_groups(cfg) == ((("qk_norm", "attn_gate", "partial_rotary",
                                          "norm_offset"), 1),)
    plain = dataclasses.replace(cfg, qk_norm=False, attn_gate=False, norm_offset=False,
                                rope=dataclasses.replace(cfg.rope, fraction=1.0))
    # the linear layers' rows are the same (measured with Qwen3-Next's norms): the full one moves
    moved = _moved(cfg, plain)
    assert [ph for _, ph in moved] == list(ops.PHASES)
    for delta, phase in moved:
        assert delta == ops.feature_deltas(host.feature_groups(cfg)[0][0], "none", phase)


def test_layers_of_different_features_are_counted_each_by_its_own():
    cfg = dataclasses.replace(load("tiny-qwen3"), layers=3, layer_types=(), nope_layers=(1,))
    assert sorted(host.feature_groups(cfg)) == [(("qk_norm",), 2), (("qk_norm", "nope"), 1)]
    parts = host.micro_issue(cfg, **RING, checkpoint="none")
    block = parts[0][0]
    assert block == (ops.block(features=("qk_norm",)) * 2
                     + ops.block(features=("qk_norm", "nope")))
    assert ops.feature_deltas(("nope",)).ops < 0  # a layer that rotates nothing


def test_a_llama_or_mla_models_blocks_take_no_features():
    for model in ("tiny", "kinds-gqa", "llama3.1-8b"):
        cfg = load(model)
        assert host.feature_groups(cfg) == (((), cfg.layers),)
    assert host.feature_groups(load("kinds-mla")) == (((), 4),)


def test_every_presets_combination_adds_up_as_measured():
    checks = ops.table()["feature_checks"]
    assert checks and all(row["holds"] for row in checks.values())
    assert {key.split("|")[1] for key in checks} == set(CHECKPOINT_MODES)
    for mode in CHECKPOINT_MODES:
        assert set(ops.FEATURES) == {k.split("|")[0] for k in ops.table()["features"]
                                     if k.endswith(f"|{mode}")}
