"""Qwen3-Next's gated DeltaNet layer on one process: seqpar's chunked rule against the recurrence's
definition, and the layer against transformers' Qwen3NextGatedDeltaNet.

transformers runs the rule, its gates and its gated norm in float32 even in a float64 model, so the
layer is held to it at float32's precision, and exactly (float64) to the same layer computed from
its own modules with those steps in float64 (the definition: the token-by-token recurrence), forward
and backward. Packed documents equal the documents run one by one; the fla backend is reachable on
CUDA only and refused elsewhere in one line."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from seqpar.algorithms.delta_rule import delta_rule, resolve
from seqpar.errors import ConfigError
from seqpar.model import Transformer, hf
from seqpar.model.deltanet import DeltaNet
from seqpar.rules import model as rules_model
from seqpar.rules.model import ModelConfig

transformers = pytest.importorskip("transformers")
from transformers.models.qwen3_next import modeling_qwen3_next as qwen3_next  # noqa: E402

HIDDEN = 32
HEADS = {"lin_k_heads": 2, "lin_v_heads": 4, "lin_k_dim": 8, "lin_v_dim": 6, "conv_kernel": 4}
CFG = ModelConfig(vocab=64, hidden=HIDDEN, layers=1, heads=4, kv_heads=2, ffn=48,
                  layer_types=("linear",), norm_eps=1e-6, **HEADS)


def recurrence(q, k, v, g, beta, scale, state=None, starts=()):
    """The gated delta rule token by token (transformers' torch_recurrent_gated_delta_rule, any
    dtype), the state zeroed where a document starts."""
    b, s, h, dk = k.shape
    state = v.new_zeros(b, h, dk, v.shape[-1]) if state is None else state
    out = []
    for t in range(s):
        if t in starts:
            state = torch.zeros_like(state)
        state = state * g[:, t].exp()[..., None, None]
        delta = (v[:, t] - (state * k[:, t, ..., None]).sum(-2)) * beta[:, t, :, None]
        state = state + k[:, t, ..., None] * delta[..., None, :]
        out.append((state * (q[:, t] * scale)[..., None]).sum(-2))
    return torch.stack(out, 1), state


def reference_layer(layer, h: torch.Tensor) -> torch.Tensor:
    """transformers' layer from its own modules, with the rule, gates and norm in h's dtype."""
    b, s, _ = h.shape
    q, k, v, z, beta, a = layer.fix_query_key_value_ordering(layer.in_proj_qkvz(h),
                                                             layer.in_proj_ba(h))
    x = torch.cat([t.reshape(b, s, -1) for t in (q, k, v)], -1).transpose(1, 2)
    x = F.silu(layer.conv1d(x)[..., :s]).transpose(1, 2)
    q, k, v = x.split([layer.key_dim, layer.key_dim, layer.value_dim], dim=-1)
    r = layer.num_v_heads // layer.num_k_heads
    q, k = (qwen3_next.l2norm(t.reshape(b, s, -1, layer.head_k_dim)).repeat_interleave(r, 2)
            for t in (q, k))
    v = v.reshape(b, s, -1, layer.head_v_dim)
    g = -layer.A_log.exp() * F.softplus(a + layer.dt_bias)
    o, _ = recurrence(q, k, v, g, beta.sigmoid(), layer.head_k_dim ** -0.5)
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + layer.norm.variance_epsilon)
    o = layer.norm.weight * o * F.silu(z)
    return layer.out_proj(o.reshape(b, s, -1))


def hf_layer(seed: int):
    config = transformers.Qwen3NextConfig(
        vocab_size=64, hidden_size=HIDDEN, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
        linear_value_head_dim=6, linear_conv_kernel_dim=4, rms_norm_eps=1e-6)
    torch.manual_seed(seed)
    layer = qwen3_next.Qwen3NextGatedDeltaNet(config, 0).double()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # every part away from its neutral value, so that each one counts
        for name, p in layer.named_parameters():
            r = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            if name == "A_log":
                r = torch.rand(p.shape, generator=gen, dtype=torch.float64).mul(2).log()
            elif name == "norm.weight":
                r = 1 + 0.3 * r
            elif p.dim() > 1:
                r = r * 0.5 if "conv" in name else r / p.shape[-1] ** 0.5
            else:
                r = 0.3 * r
            p.copy_(r)
    return layer


def params_of(layer) -> dict[str, torch.Tensor]:
    """The layer's parameters under seqpar's names (`rules.model_shapes`)."""
    return {"lin_qkvz": layer.in_proj_qkvz.weight, "lin_ba": layer.in_proj_ba.weight,
            "lin_conv": layer.conv1d.weight, "lin_dt_bias": layer.dt_bias,
            "lin_a_log": layer.A_log, "lin_norm": layer.norm.weight,
            "lin_out": layer.out_proj.weight}


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).detach().abs().max() / want.detach().abs().max())


def test_chunked_rule_is_the_recurrence_in_float64_forward_and_backward():
    gen = torch.Generator().manual_seed(0)
    b, s, h, dk, dv = 2, 150, 3, 8, 6  # three chunks, the last one short
    shapes = [(b, s, h, dk), (b, s, h, dk), (b, s, h, dv), (b, s, h), (b, s, h), (b, h, dk, dv)]
    x = [torch.randn(sh, generator=gen, dtype=torch.float64) for sh in shapes]
    x[0], x[1] = F.normalize(x[0], dim=-1), F.normalize(x[1], dim=-1)
    x[3], x[4] = -x[3].abs(), x[4].sigmoid()
    for starts in ((), (1, 64, 100)):
        ours = [t.clone().requires_grad_() for t in x]
        theirs = [t.clone().requires_grad_() for t in x]
        o, st = delta_rule(*ours[:5], dk ** -0.5, ours[5], starts)
        o2, st2 = recurrence(*theirs[:5], dk ** -0.5, theirs[5], starts)
        assert rel(o, o2) < 1e-12 and rel(st, st2) < 1e-12
        (o * o2.detach()).sum().add((st * st2.detach()).sum()).backward()
        (o2 * o2.detach()).sum().add((st2 * st2.detach()).sum()).backward()
        for a, c in zip(ours, theirs, strict=True):
            assert rel(a.grad, c.grad) < 1e-11, starts


def test_layer_matches_transformers_forward_and_backward():
    layer = hf_layer(1)
    gen = torch.Generator().manual_seed(2)
    h = torch.randn(2, 90, HIDDEN, generator=gen, dtype=torch.float64)
    dout = torch.randn(2, 90, HIDDEN, generator=gen, dtype=torch.float64)
    ours = {n: p.detach().clone().requires_grad_() for n, p in params_of(layer).items()}
    x = h.clone().requires_grad_()
    out = DeltaNet()(x, ours, CFG)
    out.backward(dout)
    with torch.no_grad():  # transformers as it runs: its float32 steps bound the agreement
        assert rel(out, layer(h)) < 2e-5
    y = h.clone().requires_grad_()
    want = reference_layer(layer, y)
    want.backward(dout)
    assert rel(out, want) < 1e-12
    assert rel(x.grad, y.grad) < 1e-12
    for name, p in params_of(layer).items():
        assert rel(ours[name].grad, p.grad) < 1e-11, name


def test_packed_documents_are_the_documents_one_by_one():
    layer = hf_layer(3)
    p = {n: t.detach() for n, t in params_of(layer).items()}
    cu = (0, 5, 7, 80, 95)
    h = torch.randn(1, cu[-1], HIDDEN, generator=torch.Generator().manual_seed(4),
                    dtype=torch.float64)
    packed = DeltaNet()(h, p, CFG, cu_seqlens=cu)
    alone = torch.cat([DeltaNet()(h[:, a:b], p, CFG)
                       for a, b in zip(cu, cu[1:], strict=False)], dim=1)
    assert rel(packed, alone) < 1e-12


def test_fla_backend_only_where_it_runs():
    assert resolve("auto", torch.device("cpu"), torch.bfloat16) == "torch"
    with pytest.raises(ConfigError, match="linear_backend='fla': runs on CUDA"):
        resolve("fla", torch.device("cpu"), torch.bfloat16)
    with pytest.raises(ConfigError, match="linear_backend='triton'"):
        resolve("triton", torch.device("cpu"), torch.float32)


def test_bfloat16_layer_close_to_float64():
    layer = hf_layer(5)
    p64 = {n: t.detach() for n, t in params_of(layer).items()}
    h = torch.randn(1, 70, HIDDEN, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    want = DeltaNet()(h, p64, CFG)
    got = DeltaNet()(h.bfloat16(), {n: t.bfloat16() for n, t in p64.items()}, CFG)
    assert got.dtype == torch.bfloat16 and rel(got.double(), want) < 5e-2


# ------------------------------------------------------------- the hybrid checkpoint (Qwen3-Next)
VOCAB, N = 128, 80  # more tokens than a chunk (64)


def save_qwen3_next(path, seed: int):
    """A random float64 Qwen3-Next checkpoint saved by transformers: three linear layers to one
    gated full-attention layer, partial rotary (a quarter), zero-centred norms, MoE with a gated
    shared expert (layer 1 dense); (the reference model, its tokens)."""
    config = transformers.Qwen3NextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, partial_rotary_factor=0.25,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
        linear_value_head_dim=8, linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=16, shared_expert_intermediate_size=24, mlp_only_layers=[1],
        norm_topk_prob=True, tie_word_embeddings=False, max_position_embeddings=256,
        rms_norm_eps=1e-6)
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"
    gen = torch.Generator().manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).double().eval()
    with torch.no_grad():
        for key, p in model.named_parameters():
            r = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            if key.endswith("A_log"):
                r = torch.rand(p.shape, generator=gen, dtype=torch.float64).add(0.5).log()
            elif key.endswith("linear_attn.norm.weight"):  # the gated norm scales by w
                r = 1 + 0.3 * r
            elif p.dim() > 1:
                r = r * 0.5 if "conv1d" in key else r / p.shape[-1] ** 0.5
            else:  # the other norms scale by 1 + w
                r = 0.3 * r
            p.copy_(r)
    model.save_pretrained(path, safe_serialization=True)
    return model, torch.randint(0, VOCAB, (2, N + 1), generator=gen)


def reference_loss(model, tokens: torch.Tensor) -> float:
    with torch.no_grad():
        logits = model(input_ids=tokens[:, :-1]).logits
    return F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1)).item()


def test_a_qwen3_next_checkpoint_computes_the_reference_loss(tmp_path, seed):
    model, tokens = save_qwen3_next(tmp_path, seed)
    cfg = rules_model.load(str(tmp_path / "config.json"))
    assert cfg.layer_types == ("linear", "linear", "linear", "full") and cfg.shared_gate
    net = Transformer(cfg, dtype=torch.float64, seed=1)
    hf.load(net, str(tmp_path))
    got, want = net.loss(tokens).item(), reference_loss(model, tokens)
    err = abs(got - want) / abs(want)
    print(f"qwen3-next: seqpar {got!r} transformers {want!r} relative {err:.2e}")
    assert err < 1e-6, (got, want, err)
    ours, mine = dict(net.named_parameters()), net.hidden(tokens)[0].detach()
    # the gates dropped: every token's hidden state far off (the mean loss alone can barely move:
    # under 1e-4 in 3 of 40 draws for the attention's gate, while the states moved 18% or more)
    for change in ({"attn_gate": False}, {"shared_gate": False}):
        other = Transformer(dataclasses.replace(cfg, **change), dtype=torch.float64, seed=1)
        with torch.no_grad():
            for name, p in other.named_parameters():
                q = ours[name]
                if p.shape != q.shape:  # wq without the gate: each head's query rows
                    q = q.view(cfg.heads, 2, cfg.head_dim, -1)[:, 0].reshape(p.shape)
                p.copy_(q)
        moved = (other.hidden(tokens)[0].detach() - mine).abs().max() / mine.abs().max()
        assert moved > 1e-2, (change, moved)


def test_linear_sp_on_a_model_without_linear_layers_is_one_line():
    cfg = ModelConfig(vocab=32, hidden=16, layers=2, heads=2, kv_heads=2, ffn=16)
    with pytest.raises(ConfigError, match=r"^linear_sp='lasp2': applies to linear-attention "
                                          r"layers, and this llama model has none") as e:
        Transformer(cfg, dtype=torch.float64, linear_sp="lasp2")
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"^linear_sp='lasp3': must be one of lasp2, lasp1"):
        Transformer(CFG, dtype=torch.float64, linear_sp="lasp3")


@pytest.mark.parametrize(("change", "words"), [
    ({"model": "llama3.1-8b", "linear_sp": "lasp1"}, "linear_sp='lasp1': applies to linear"),
    ({"layout": "zigzag"}, "layout='zigzag': must be contiguous for a model with linear"),
])
def test_a_training_case_refuses_lasp_it_cannot_run_before_any_rank_starts(tmp_path, change,
                                                                           words):
    """A sweep's training case: `train.linear_sp` on a model without linear layers, a hybrid in a
    layout of several stretches a rank: one line, from `TrainCase.validate`."""
    import yaml

    from seqpar.case.train import TrainCase

    fields = {f.name: getattr(CFG, f.name) for f in dataclasses.fields(CFG)}
    fields["rope"] = dataclasses.asdict(CFG.rope)
    model = tmp_path / "hybrid.yaml"
    model.write_text(yaml.safe_dump({k: list(v) if isinstance(v, tuple) else v
                                     for k, v in fields.items()}))
    good = TrainCase(algorithm="ring", sp=2, seq_len=64, model=str(model), layout="contiguous",
                     linear_sp="lasp2")
    good.validate()
    with pytest.raises(ConfigError) as e:
        dataclasses.replace(good, **change).validate()
    assert str(e.value).startswith(words) and "\n" not in str(e.value)
