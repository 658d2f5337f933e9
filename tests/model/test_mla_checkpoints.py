"""Multi-head latent attention (DeepSeek-V2/V3, Kimi K2) held to Hugging Face transformers: a tiny
float64 checkpoint saved by transformers, read back by seqpar (config.json by `rules.model.load`,
tensors by `hf.load`), computes the reference's mean next-token loss to relative 1e-6 —
DeepSeek-V3 with a low-rank query, interleaved RoPE pairs, YaRN with mscale, grouped sigmoid
routing with its score bias and shared experts; V3 with a full query projection and RoPE halves;
V2 with its softmax routing times routed_scaling_factor. The multi-token-prediction layer's tensors
are skipped by name, said once; the grouped router is transformers' to the expert."""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest
import torch
import torch.nn.functional as F

from seqpar.errors import ConfigError
from seqpar.model import Transformer, hf, moe
from seqpar.rules import model as rules_model

transformers = pytest.importorskip("transformers")

VOCAB, N = 128, 24
COMMON = {"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 96,
          "moe_intermediate_size": 16, "num_hidden_layers": 3, "num_attention_heads": 4,
          "num_key_value_heads": 4, "n_shared_experts": 1, "n_routed_experts": 8,
          "kv_lora_rank": 16, "qk_rope_head_dim": 8, "v_head_dim": 10, "qk_nope_head_dim": 12,
          "num_experts_per_tok": 2, "first_k_dense_replace": 1, "max_position_embeddings": 256,
          "tie_word_embeddings": False}
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
        "original_max_position_embeddings": 64, "beta_fast": 32, "beta_slow": 1}


def configs() -> dict:
    t = transformers
    return {
        "deepseek-v3": t.DeepseekV3Config(
            **COMMON, q_lora_rank=24, rope_interleave=True, n_group=4, topk_group=2,
            routed_scaling_factor=2.5, norm_topk_prob=True,
            rope_parameters={**YARN, "mscale": 1.0, "mscale_all_dim": 1.0}),
        "deepseek-v3-full-q": t.DeepseekV3Config(
            **COMMON, q_lora_rank=None, rope_interleave=False, n_group=2, topk_group=1,
            routed_scaling_factor=1.5, norm_topk_prob=False),
        "deepseek-v2": t.DeepseekV2Config(
            **COMMON, q_lora_rank=24, routed_scaling_factor=2.0, topk_method="greedy",
            rope_parameters={**YARN, "mscale": 0.707, "mscale_all_dim": 0.707}),
    }


def save(name: str, path, seed: int):
    """A random float64 checkpoint in `path` (config.json as published: without transformers'
    own mlp_bias); (the reference model, its tokens). Matrices N(0, 1/fan-in), norms 1 + N(0,
    0.3^2), the score bias N(0, 0.3^2): every part moves the loss."""
    gen = torch.Generator().manual_seed(seed)
    config = configs()[name]
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(config).double().eval()
    with torch.no_grad():
        for key, p in model.named_parameters():
            r = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            p.copy_(r / p.shape[-1] ** 0.5 if p.dim() > 1 else r * 0.3 + ("norm" in key))
        for key, b in model.named_buffers():
            if key.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=gen, dtype=torch.float64) * 0.3)
    model.save_pretrained(path, safe_serialization=True)
    data = json.loads((path / "config.json").read_text())
    data.pop("mlp_bias", None)
    (path / "config.json").write_text(json.dumps(data))
    return model, torch.randint(0, VOCAB, (2, N + 1), generator=gen)


def reference_loss(model, tokens: torch.Tensor) -> float:
    with torch.no_grad():
        logits = model(input_ids=tokens[:, :-1]).logits
    return F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1)).item()


def seqpar_model(path, cfg=None, **kwargs) -> Transformer:
    cfg = cfg or rules_model.load(str(path / "config.json"))
    net = Transformer(cfg, dtype=torch.float64, seed=1, **kwargs)
    hf.load(net, str(path))
    return net


@pytest.mark.parametrize("name", list(configs()))
def test_an_mla_checkpoint_computes_the_reference_loss(name, tmp_path, seed):
    model, tokens = save(name, tmp_path, seed)
    want = reference_loss(model, tokens)
    net = seqpar_model(tmp_path)
    assert net.cfg.mla and net.cfg.v_head_dim != net.cfg.head_dim
    got = net.loss(tokens).item()
    err = abs(got - want) / abs(want)
    print(f"{name}: seqpar {got!r} transformers {want!r} relative {err:.2e}")
    assert err < 1e-6, (name, got, want, err)


@pytest.mark.parametrize("change", [{"rope_interleave": False}, {"n_group": 1, "topk_group": 1}])
def test_what_was_silently_dropped_misses_the_reference_by_far(change, tmp_path, seed):
    """RoPE halves on interleaved pairs, routing without the group limit: 100x the parity
    tolerance off. (A draw whose every token's top-k already lies in its best groups routes alike
    without the limit: a clean clone drew one that moved the loss 6.5e-5, 0 of 40 others did, so
    the first of the next few draws that routes across groups is taken.)"""
    misses = []
    for offset in range(8):
        path = tmp_path / str(offset)
        path.mkdir()
        model, tokens = save("deepseek-v3", path, seed + offset)
        cfg = dataclasses.replace(rules_model.load(str(path / "config.json")), **change)
        got = seqpar_model(path, cfg).loss(tokens).item()
        misses.append(abs(got - reference_loss(model, tokens)) / got)
        if misses[-1] > 1e-4:
            break
    assert misses[-1] > 1e-4, (seed, misses)


def test_the_multi_token_prediction_layer_is_skipped_by_name_and_said_once(tmp_path, seed,
                                                                            caplog):
    from safetensors.torch import load_file, save_file

    model, tokens = save("deepseek-v3", tmp_path, seed)
    file = tmp_path / "model.safetensors"
    tensors = load_file(str(file))
    for key in ("eh_proj.weight", "enorm.weight", "self_attn.kv_b_proj.weight"):  # layer 3
        tensors[f"model.layers.3.{key}"] = torch.ones(2, 2, dtype=torch.float64)
    save_file(tensors, str(file))
    with caplog.at_level(logging.WARNING, logger="seqpar.hf"):
        net = seqpar_model(tmp_path)
    said = [r.getMessage() for r in caplog.records if "multi-token" in r.getMessage()]
    assert len(said) == 1 and "3 tensors" in said[0] and "model.layers.3.*" in said[0]
    assert abs(net.loss(tokens).item() - reference_loss(model, tokens)) < 1e-5
    tensors["model.layers.1.self_attn.q_proj.weight"] = torch.ones(2, 2, dtype=torch.float64)
    save_file(tensors, str(file))
    with pytest.raises(ConfigError, match=r"holds model.layers.1.self_attn.q_proj.weight") as e:
        seqpar_model(tmp_path)
    assert "\n" not in str(e.value)


def test_the_grouped_sigmoid_router_picks_and_weighs_as_the_reference(seed):
    """DeepSeek-V3's router (float32, as the reference keeps it): the same experts, the same
    weights; the score bias changes which experts, never their weights' formula."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    gen = torch.Generator().manual_seed(seed)
    config = configs()["deepseek-v3"]
    router = DeepseekV3TopkRouter(config)
    with torch.no_grad():
        router.weight.copy_(torch.randn(router.weight.shape, generator=gen))
        router.e_score_correction_bias.copy_(torch.randn(8, generator=gen) * 0.3)
    x = torch.randn(64, 64, generator=gen)
    _, want_w, want_e = router(x)
    cfg = rules_model.from_hf(config.to_dict(), "config")
    r = moe.route(x, {"router": router.weight, "router_score_bias":
                      router.e_score_correction_bias}, cfg)
    got_e, order = r.experts.sort(dim=-1)
    assert torch.equal(got_e, want_e.sort(dim=-1).values)
    want = want_w.gather(1, want_e.sort(dim=-1).indices)
    assert torch.allclose(r.weights.gather(1, order), want, rtol=1e-6, atol=0)


def test_train_mla_pass_is_a_sweep_key_checked_before_any_rank_starts(tmp_path, seed):
    """train.mla_pass reaches the trial (latent for a DeepSeek config.json on a ring), is refused
    in one line naming train.mla_pass for a model without MLA or an algorithm that moves heads,
    and leaves the hash of a spec that does not set it as it was."""
    from seqpar.experiments.spec import ExperimentSpec

    save("deepseek-v3", tmp_path, seed)
    model = str(tmp_path / "config.json")

    def spec(train: dict, algorithm: str = "ring") -> ExperimentSpec:
        return ExperimentSpec.parse({"plan": {"algorithm": algorithm, "world": 2},
                                     "workload": {"seq_len": 64}, "train": train})

    assert spec({"model": model, "mla_pass": "latent"}).to_case().mla_pass == "latent"
    assert spec({"model": model}).hash == spec({"model": model, "mla_pass": "kv"}).hash
    assert spec({"model": model}).hash != spec({"model": model, "mla_pass": "latent"}).hash
    for train, algorithm, words in (({"model": "tiny", "mla_pass": "latent"}, "ring",
                                     "multi-head latent attention"),
                                    ({"model": model, "mla_pass": "latent"}, "ulysses",
                                     "move K,V heads")):
        with pytest.raises(ConfigError) as err:
            spec(train, algorithm)
        assert "train.mla_pass" in str(err.value) and words in str(err.value)
        assert "\n" not in str(err.value)
