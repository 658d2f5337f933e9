"""Every family's tiny checkpoint, saved by Hugging Face transformers (the families' reference), read
back by seqpar (its config.json by `rules.model.load`, its tensors by `hf.load`) computes the
reference's mean next-token loss in float64 to relative 1e-6 (transformers' RoPE, norms and softmax
run in float32 even in a float64 model: lifted to float64, the losses agree to 1e-12).
test_family_sp.py: the same models under ring and ulysses at P = 2.

The random weights are drawn large enough (matrices at 1/sqrt(fan-in), norms, biases and sinks away
from 1 and 0) that every part of a layer moves the outputs: the two models that were silently
wrong before (Llama 3.1 without its RoPE scaling, Qwen2 without its biases) move every token's
hidden state by far more than the 1e-6 the loss is held to.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
import torch.nn.functional as F

from seqpar.errors import ConfigError
from seqpar.model import Transformer, hf
from seqpar.model.block import layer_rope
from seqpar.model.layers import apply_rope, rotary_tables
from seqpar.rules import model as rules_model
from seqpar.rules.rope import Rope, attention_factor, inv_freq
from tests.model.test_family_sp import seqpar_model

transformers = pytest.importorskip("transformers")

VOCAB, HIDDEN, N = 128, 64, 24
BASE = {"vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": 96,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
        "max_position_embeddings": 256}
LLAMA3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}


def family_configs() -> dict:
    t = transformers
    return {
        "llama3.1": t.LlamaConfig(**BASE, rope_parameters=LLAMA3, tie_word_embeddings=False),
        "qwen2": t.Qwen2Config(**BASE, tie_word_embeddings=False),
        "qwen3": t.Qwen3Config(**BASE, head_dim=24, tie_word_embeddings=False),
        "qwen3-tied": t.Qwen3Config(**BASE, head_dim=24, tie_word_embeddings=True),
        "gemma3": t.Gemma3TextConfig(
            **{**BASE, "num_hidden_layers": 6}, head_dim=24, sliding_window=5,
            query_pre_attn_scalar=20, rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}),
        "smollm3": t.SmolLM3Config(**{**BASE, "num_hidden_layers": 4}, no_rope_layer_interval=2,
                                   pad_token_id=0, bos_token_id=1, eos_token_id=2),
        "mistral": t.MistralConfig(**BASE, sliding_window=5, tie_word_embeddings=False),
        "gpt-oss": t.GptOssConfig(**{**BASE, "intermediate_size": 32,
                                     "max_position_embeddings": 131072}, head_dim=16,
                                  num_local_experts=4, num_experts_per_tok=2, sliding_window=5,
                                  swiglu_limit=1.0, tie_word_embeddings=False),
        "mixtral": t.MixtralConfig(**{**BASE, "intermediate_size": 48}, num_local_experts=4,
                                   num_experts_per_tok=2, output_router_logits=True,
                                   router_aux_loss_coef=0.1, tie_word_embeddings=False),
        "qwen3-moe": t.Qwen3MoeConfig(**{**BASE, "num_hidden_layers": 3}, head_dim=24,
                                      moe_intermediate_size=32, num_experts=4,
                                      num_experts_per_tok=2, mlp_only_layers=[1],
                                      norm_topk_prob=True, tie_word_embeddings=False),
    }


@torch.no_grad()
def _randomise(model, gen: torch.Generator) -> None:
    """Weights that make every part count: matrices N(0, 1/fan-in), norm weights 1 + N(0, 0.3^2)
    (Gemma's stored w: N(0, 0.3^2)), biases N(0, 0.3^2), sinks N(0, 1)."""
    offset = model.config.model_type.startswith("gemma")
    for name, p in model.named_parameters():
        r = torch.randn(p.shape, generator=gen, dtype=torch.float64)
        if p.dim() > 1:
            p.copy_(r / p.shape[-1] ** 0.5)
        elif "norm" in name:
            p.copy_(r * 0.3 + (0.0 if offset else 1.0))
        else:
            p.copy_(r * (1.0 if name.endswith("sinks") else 0.3))


def save_family(name: str, path, seed: int):
    """A random float64 checkpoint of family `name` in `path`; (the reference model, its tokens)."""
    gen = torch.Generator().manual_seed(seed)
    config = family_configs()[name]
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"  # the plain loop over experts (float64)
    model = transformers.AutoModelForCausalLM.from_config(config).double().eval()
    _randomise(model, gen)
    model.save_pretrained(path, safe_serialization=True)
    tokens = torch.randint(0, VOCAB, (2, N + 1), generator=gen)
    return model, tokens


def reference_loss(model, tokens: torch.Tensor) -> float:
    """The reference's mean next-token cross-entropy over the batch (its logits, our shift)."""
    aux = getattr(model.config, "output_router_logits", False)
    with torch.no_grad():
        out = model(input_ids=tokens[:, :-1], **({"output_router_logits": True} if aux else {}))
    loss = F.cross_entropy(out.logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    if aux:  # the reference adds its load-balancing loss where the config turns it on
        loss = loss + model.config.router_aux_loss_coef * out.aux_loss
    return loss.item()


@pytest.mark.parametrize("family", list(family_configs()))
def test_a_family_checkpoint_computes_the_reference_loss(family, tmp_path, seed):
    model, tokens = save_family(family, tmp_path, seed)
    want = reference_loss(model, tokens)
    got = seqpar_model(tmp_path).loss(tokens).item()
    err = abs(got - want) / abs(want)
    print(f"{family}: seqpar {got!r} transformers {want!r} relative {err:.2e}")
    assert err < 1e-6, (family, got, want, err)


def _rms_norm64(self, x: torch.Tensor) -> torch.Tensor:
    eps = getattr(self, "variance_epsilon", getattr(self, "eps", None))
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * (1.0 + self.weight) if type(self).__name__.startswith("Gemma") else self.weight * y


def _in_float64(model, cfg) -> None:
    """The reference with its float32 steps in float64: RMSNorms, RoPE tables (frequencies from
    rules.rope, which tests/unit holds to the reference's) and, but for gpt-oss's own eager
    attention (sinks), SDPA in place of the eager softmax's float32."""
    for m in model.modules():
        kind = type(m).__name__
        if kind.endswith("RMSNorm"):
            m.forward = _rms_norm64.__get__(m)
        elif kind.endswith("RotaryEmbedding"):
            def tables(x, position_ids, layer_type=None, half=kind.startswith("GptOss")):
                rope = cfg.rope  # one table for every layer, unless the family has one a kind
                if layer_type is not None:
                    of = "sliding" if layer_type == "sliding_attention" else "full"
                    rope = layer_rope(cfg, cfg.layer_types.index(of))
                angles = position_ids[..., None].double() * torch.tensor(
                    inv_freq(rope, cfg.head_dim), dtype=torch.float64)
                emb = angles if half else torch.cat([angles, angles], dim=-1)
                return emb.cos() * attention_factor(rope), emb.sin() * attention_factor(rope)
            m.forward = tables
        if hasattr(m, "config") and model.config.model_type != "gpt_oss":
            m.config._attn_implementation = "sdpa"


@pytest.mark.parametrize("family", [f for f in family_configs()
                                    if f not in ("mixtral", "qwen3-moe")])
def test_with_the_references_float32_lifted_the_loss_is_equal_to_rounding(family, tmp_path, seed):
    """What is left of the 1e-6 above is the reference's float32 (norms, RoPE tables, softmax),
    not a different function: with those in float64 the losses agree to 1e-12. (Mixtral's and
    Qwen3-MoE's routers softmax in float32 too: they stay at the 1e-6 test.)"""
    model, tokens = save_family(family, tmp_path, seed)
    net = seqpar_model(tmp_path)
    _in_float64(model, net.cfg)
    want = reference_loss(model, tokens)
    assert abs(net.loss(tokens).item() - want) / want < 1e-12


@pytest.mark.parametrize(("family", "change"), [
    ("llama3.1", {"rope": Rope(theta=10000.0)}),      # the scaling ignored
    ("qwen2", {"qkv_bias": False}),                               # the biases left out
    ("gemma3", {"layer_types": ("full",) * 6}),                   # no windows
    ("smollm3", {"nope_layers": ()}),                             # every layer rotates
])
def test_what_was_silently_dropped_misses_the_reference_by_far(family, change, tmp_path, seed):
    """The model read as published (the reference's to 1e-6 above) and the same checkpoint with
    the feature dropped: every token's final hidden state far apart (the mean loss alone moved
    under 1e-4 in one clean clone's draw; the states 19% or more in 25 draws of each)."""
    _, tokens = save_family(family, tmp_path, seed)
    names = set(hf.checkpoint_shapes(str(tmp_path)))
    read = rules_model.load(str(tmp_path / "config.json"))
    states = []
    for cfg in (read, dataclasses.replace(read, **change)):
        net = Transformer(cfg, dtype=torch.float64, seed=1)
        for name, p in net.named_parameters():  # what the model has, from the checkpoint
            key = hf.sources(cfg, names)[name].keys[0]
            with torch.no_grad():
                p.copy_(hf_tensor(tmp_path, key))
        states.append(net.hidden(tokens)[0].detach())
    right, dropped = states
    assert (dropped - right).abs().max() > 1e-2 * right.abs().max()


def hf_tensor(path, key: str) -> torch.Tensor:
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        return f.get_tensor(key)


def test_a_checkpoint_with_a_tensor_the_model_lacks_is_a_one_line_error(tmp_path, seed):
    from safetensors.torch import load_file, save_file

    save_family("qwen3", tmp_path, seed)
    file = tmp_path / "model.safetensors"
    tensors = load_file(str(file))
    tensors["model.layers.0.self_attn.o_proj.bias"] = torch.zeros(HIDDEN, dtype=torch.float64)
    tensors["model.layers.1.self_attn.rotary_emb.inv_freq"] = torch.ones(4)  # the reference skips
    save_file(tensors, str(file))
    with pytest.raises(ConfigError, match=r"holds model.layers.0.self_attn.o_proj.bias") as e:
        seqpar_model(tmp_path)
    assert "\n" not in str(e.value)
    del tensors["model.layers.0.self_attn.o_proj.bias"]
    save_file(tensors, str(file))
    seqpar_model(tmp_path)


@pytest.mark.parametrize(("family", "names"), [("qwen3-moe", ("gate_proj", "up_proj", "down_proj")),
                                               ("mixtral", ("w1", "w3", "w2"))])
def test_fused_experts_load_as_the_per_expert_tensors(family, names, tmp_path, seed):
    """transformers 5's own fused experts (experts.gate_up_proj (E, 2f, d): gate then up;
    experts.down_proj (E, d, f)) load to the model the per-expert tensors that save_pretrained
    writes (and the Hub holds) load to."""
    from safetensors.torch import load_file, save_file

    model, tokens = save_family(family, tmp_path, seed)
    per_expert = seqpar_model(tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    pattern = re.compile(r"(.*\.)(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)\.weight$")
    experts: dict[str, dict] = {}
    for key in [k for k in tensors if pattern.match(k)]:
        layer, j, name = pattern.match(key).groups()
        experts.setdefault(layer, {})[(int(j), name)] = tensors.pop(key)
    for layer, parts in experts.items():
        e = max(j for j, _ in parts) + 1
        tensors[layer + "mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([parts[(j, names[0])], parts[(j, names[1])]]) for j in range(e)])
        tensors[layer + "mlp.experts.down_proj"] = torch.stack([parts[(j, names[2])]
                                                                 for j in range(e)])
        gate = layer + "block_sparse_moe.gate.weight"  # transformers 5 names Mixtral's router so
        if gate in tensors:
            tensors[layer + "mlp.gate.weight"] = tensors.pop(gate)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    fused = seqpar_model(tmp_path)
    for (name, a), b in zip(per_expert.named_parameters(), fused.parameters(), strict=True):
        assert torch.equal(a, b), name
    assert fused.loss(tokens).item() == per_expert.loss(tokens).item()


def test_a_rotary_fraction_turns_the_first_dimensions_of_each_head_only(seed):
    """Partial rotary as the reference applies it: rotate-half within the first rotary_dim
    dimensions of each head, the rest passed through (here from YaRN tables, factor included)."""
    from transformers.models.llama.modeling_llama import rotate_half

    gen = torch.Generator().manual_seed(seed)
    rope = Rope(theta=10000.0, kind="yarn", factor=4.0, original_max=32, fraction=0.5)
    x = torch.randn(2, 9, 3, 16, generator=gen, dtype=torch.float64)
    pos = torch.randperm(64, generator=gen)[:9]
    freqs = torch.tensor(inv_freq(rope, 16), dtype=torch.float64)
    cos, signed = rotary_tables(pos, freqs, torch.float64, attention_factor(rope))
    angles = pos.double()[:, None] * freqs[None, :]
    emb = torch.cat([angles, angles], dim=-1)[None, :, None, :]
    c, s = emb.cos() * attention_factor(rope), emb.sin() * attention_factor(rope)
    turned, rest = x[..., :8], x[..., 8:]
    want = torch.cat([turned * c + rotate_half(turned) * s, rest], dim=-1)
    got = apply_rope(x, cos, signed)
    assert torch.allclose(got, want, rtol=0, atol=1e-14) and torch.equal(got[..., 8:], rest)
    assert not torch.allclose(got[..., :8], turned)
