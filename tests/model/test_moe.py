"""seqpar.model.moe against transformers' own MoE blocks (Mixtral, Qwen3-MoE, gpt-oss) and their
load-balancing loss, in float64 on random inputs; the loss over a sequence split on two ranks.

Mixtral's and Qwen3-MoE's routers round their softmax to float32 (gpt-oss's does not), so their
whole blocks agree to float32's precision; with the same routing, the experts agree to float64's.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from seqpar.model.moe import aux_loss, moe_ffn, route
from seqpar.rules.model import ModelConfig, ffn_shapes

D, F, E = 16, 24, 8
FAMILIES = ("mixtral", "qwen3_moe", "qwen3_moe_unnormed", "gpt_oss")
EAGER = {"experts_implementation": "eager"}  # the experts' loop as written in the modeling files


def _cfg(family: str, k: int = 2, **extra) -> ModelConfig:
    base = dict(vocab=11, hidden=D, layers=2, heads=2, kv_heads=2, ffn=F, experts=E,
                experts_per_tok=k, moe_ffn=F, **extra)
    if family == "gpt_oss":
        return ModelConfig(**base, act="swiglu_oai", swiglu_limit=7.0, router="topk_softmax",
                           router_bias=True, expert_bias=True)
    return ModelConfig(**base, norm_topk=family != "qwen3_moe_unnormed")


def _reference(family: str, k: int) -> torch.nn.Module:
    """transformers' block, its parameters drawn at random (they are created empty)."""
    # transformers imported here: the ranks that unpickle _split_aux need none of its 5 s import
    from transformers import GptOssConfig, MixtralConfig, Qwen3MoeConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    if family == "gpt_oss":
        block = GptOssMLP(GptOssConfig(hidden_size=D, intermediate_size=F, num_local_experts=E,
                                       num_experts_per_tok=k, swiglu_limit=7.0, **EAGER))
    elif family == "mixtral":
        block = MixtralSparseMoeBlock(MixtralConfig(hidden_size=D, intermediate_size=F,
                                                    num_local_experts=E, num_experts_per_tok=k,
                                                    **EAGER))
    else:
        block = Qwen3MoeSparseMoeBlock(Qwen3MoeConfig(
            hidden_size=D, moe_intermediate_size=F, num_experts=E, num_experts_per_tok=k,
            norm_topk_prob=family == "qwen3_moe", **EAGER))
    block = block.double()
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    return block


def _ours(family: str, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' tensors (or their gradients) under seqpar's names: transformers 5 fuses the
    gate and up projections, stacked [gate; up] (Mixtral, Qwen3) or interleaved gate0, up0, ...
    and transposed (gpt-oss)."""
    if family == "gpt_oss":
        gate_up, bias = t["experts.gate_up_proj"], t["experts.gate_up_proj_bias"]
        return {"router": t["router.weight"], "router_bias": t["router.bias"],
                "experts_w1": gate_up[..., ::2].transpose(1, 2),
                "experts_w3": gate_up[..., 1::2].transpose(1, 2),
                "experts_w2": t["experts.down_proj"].transpose(1, 2),
                "experts_b1": bias[:, ::2], "experts_b3": bias[:, 1::2],
                "experts_b2": t["experts.down_proj_bias"]}
    gate_up = t["experts.gate_up_proj"]
    return {"router": t["gate.weight"], "experts_w1": gate_up[:, :F], "experts_w3": gate_up[:, F:],
            "experts_w2": t["experts.down_proj"]}


def _params(family: str, block: torch.nn.Module) -> dict[str, torch.Tensor]:
    p = _ours(family, dict(block.named_parameters()))
    return {n: v.detach().clone().contiguous().requires_grad_() for n, v in p.items()}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().abs().max() / b.detach().abs().max())


def _run_ours(family, block, cfg, x, g):
    p = _params(family, block)
    assert {n: tuple(v.shape) for n, v in p.items()} == ffn_shapes(cfg, moe=True)
    x = x.clone().requires_grad_()
    out, stats = moe_ffn(x, p, cfg)
    (out * g).sum().backward()
    return out, stats, x.grad, {n: v.grad for n, v in p.items()}


def _draw(b: int, s: int, family: str) -> tuple[torch.Tensor, torch.Tensor]:
    scale = 4.0 if family == "gpt_oss" else 1.0  # gpt-oss: past the clamp at 7 often
    return torch.randn(b, s, D, dtype=torch.float64) * scale, torch.randn(b, s, D,
                                                                          dtype=torch.float64)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("b,s,k", [(2, 9, 2), (1, 3, 2), (2, 5, 3)])
def test_moe_block_matches_transformers(family, b, s, k, seed):
    torch.manual_seed(seed)
    cfg, block = _cfg(family, k), _reference(family, k)
    x, g = _draw(b, s, family)
    out, stats, x_grad, grads = _run_ours(family, block, cfg, x, g)
    assert int(stats.counts.sum()) == b * s * k and int(stats.tokens) == b * s
    if b * s * k < E:
        assert (stats.counts == 0).any()  # idle experts must work
    xr = x.clone().requires_grad_()
    ref = block(xr)
    ref = ref[0] if isinstance(ref, tuple) else ref
    (ref * g).sum().backward()
    # gpt-oss's router stays in float64; Mixtral's and Qwen3's round to float32 (docstring): up
    # to 1.1e-6 relative over 60 draws, a router left unnormalised shows at 1e-1
    tol = 1e-10 if family == "gpt_oss" else 1e-5
    assert _rel(out, ref) < tol
    assert _rel(x_grad, xr.grad) < tol
    want = _ours(family, {n: v.grad for n, v in block.named_parameters()})
    for name, grad in grads.items():
        assert _rel(grad, want[name]) < tol, name


@pytest.mark.parametrize("family", FAMILIES)
def test_moe_experts_match_transformers_exactly_given_the_routing(family, seed):
    """The reference's experts on seqpar's routing: every gradient (the router's through the
    routing weights) to float64's precision."""
    torch.manual_seed(seed)
    cfg, block = _cfg(family), _reference(family, 2)
    x, g = _draw(2, 7, family)
    out, _, x_grad, grads = _run_ours(family, block, cfg, x, g)
    p, xr = _params(family, block), x.clone().requires_grad_()
    flat = xr.reshape(-1, D)
    r = route(flat, p, cfg)
    ref = block.experts(flat, r.experts, r.weights).view_as(x)
    (ref * g).sum().backward()
    assert _rel(out, ref) < 1e-10 and _rel(x_grad, xr.grad) < 1e-10
    assert _rel(grads["router"], p["router"].grad) < 1e-10
    # the block's own router is not used here: zeros stand for its gradient
    want = _ours(family, {n: torch.zeros_like(v) if v.grad is None else v.grad
                          for n, v in block.named_parameters()})
    for name in (n for n in grads if n.startswith("experts_")):
        assert _rel(grads[name], want[name]) < 1e-10, name


@pytest.mark.parametrize("family", ("mixtral", "gpt_oss"))
@pytest.mark.parametrize("masked", (False, True))
def test_aux_loss_matches_load_balancing_loss_func(family, masked, seed):
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    torch.manual_seed(seed)
    cfg = _cfg(family, aux_loss_coef=0.01)
    b, s = 2, 11
    layers = [_params(family, _reference(family, 2)) for _ in range(2)]
    xs = [torch.randn(b, s, D, dtype=torch.float64) for _ in layers]
    mask = (torch.rand(b, s) < 0.7).long() if masked else None
    stats = [moe_ffn(x, p, cfg, mask)[1] for x, p in zip(xs, layers, strict=True)]
    ours = aux_loss(stats, cfg)
    ours.backward()
    got = [p["router"].grad.clone() for p in layers]
    for p in layers:
        p["router"].grad = None
    logits = tuple(torch.nn.functional.linear(x.reshape(b * s, D), p["router"], p.get("router_bias"))
                   for x, p in zip(xs, layers, strict=True))
    ref = load_balancing_loss_func(logits, E, 2, mask)
    ref.backward()
    # transformers sums the probabilities in float32
    assert abs(ours.item() - ref.item()) < 1e-6 * ref.item()
    for grad, p in zip(got, layers, strict=True):
        assert _rel(grad, p["router"].grad) < 1e-5


def test_moe_costs_k_experts_and_the_router_per_token(seed):
    """Only the routed experts run: FLOPs are 2 (k 3 f d + E d) + 2 (3 s d) a token, shared
    experts included, whatever the load."""
    torch.manual_seed(seed)
    cfg = _cfg("mixtral", k=3, shared_ffn=20)
    p = {n: torch.randn(*shape, dtype=torch.float64) for n, shape in ffn_shapes(cfg, True).items()}
    n = 13
    with FlopCounterMode(display=False) as counter:
        out, _ = moe_ffn(torch.randn(1, n, D, dtype=torch.float64), p, cfg)
    assert counter.get_total_flops() == n * 2 * (3 * 3 * F * D + E * D + 3 * 20 * D)
    assert out.shape == (1, n, D)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
@pytest.mark.parametrize("family", ("qwen3_moe", "gpt_oss"))
def test_moe_low_precision_follows_float64(family, dtype, seed):
    torch.manual_seed(seed)
    cfg = _cfg(family, shared_ffn=12, aux_loss_coef=0.01)
    p64 = {n: torch.randn(*s, dtype=torch.float64) * 0.3 for n, s in ffn_shapes(cfg, True).items()}
    x64 = torch.randn(2, 6, D, dtype=torch.float64)
    want, _ = moe_ffn(x64, p64, cfg)
    p = {n: v.to(dtype).requires_grad_() for n, v in p64.items()}
    x = x64.to(dtype).requires_grad_()
    got, stats = moe_ffn(x, p, cfg)
    assert got.dtype == dtype and stats.prob_sum.dtype == torch.float32
    # bf16 rounds the logits, which may flip a near-tied expert choice for a token
    close = ((got.double() - want).abs().amax(-1) < 0.05 * want.abs().max()).float().mean()
    assert close > (0.99 if dtype == torch.float32 else 0.75)
    (got.float().square().sum() + aux_loss([stats], cfg)).backward()
    assert all(v.grad is not None and v.grad.isfinite().all() for v in [x, *p.values()])


def test_moe_empty_shard_has_zero_gradients_and_no_aux(seed):
    torch.manual_seed(seed)
    cfg = _cfg("gpt_oss", aux_loss_coef=0.01)
    p = {n: torch.randn(*s, dtype=torch.float64, requires_grad=True)
         for n, s in ffn_shapes(cfg, True).items()}
    out, stats = moe_ffn(torch.zeros(1, 0, D, dtype=torch.float64), p, cfg)
    (out.sum() + aux_loss([stats], cfg)).backward()
    assert out.shape == (1, 0, D) and int(stats.tokens) == 0
    assert all(v.grad is not None and not v.grad.any() for v in p.values())


def _split_aux(env, cfg, layers, xs, mask, cut):
    """One rank's half of the sequence: its outputs, the aux loss over the group, and its router
    gradients of aux / world (the share each rank adds)."""
    group = env.group(2)
    lo, hi = (0, cut) if env.rank == 0 else (cut, xs[0].shape[1])
    layers = [{n: v.clone().requires_grad_() for n, v in p.items()} for p in layers]
    outs, stats = [], []
    for x, p in zip(xs, layers, strict=True):
        out, st = moe_ffn(x[:, lo:hi], p, cfg, mask[:, lo:hi])
        outs.append(out.detach())
        stats.append(st)
    aux = aux_loss(stats, cfg, group)
    (aux / 2).backward()
    return float(aux), outs, [p["router"].grad for p in layers]


@pytest.mark.multirank
def test_aux_loss_over_a_sequence_split_on_two_ranks_is_the_whole_sequences(gang, seed):
    torch.manual_seed(seed)
    cfg = _cfg("mixtral", aux_loss_coef=0.01)
    b, s = 2, 9
    cut = int(torch.randint(1, s, ()))  # uneven halves
    layers = [{n: (torch.randn(*shape, dtype=torch.float64) * 0.5).requires_grad_()
               for n, shape in ffn_shapes(cfg, True).items()} for _ in range(2)]
    xs = [torch.randn(b, s, D, dtype=torch.float64) for _ in layers]
    mask = torch.ones(b, s, dtype=torch.long)
    mask[:, -2:] = 0  # padding at the sequence's end, on the second rank
    whole = [moe_ffn(x, p, cfg, mask) for x, p in zip(xs, layers, strict=True)]
    want = aux_loss([st for _, st in whole], cfg)
    want.backward()
    ranks = gang.run(_split_aux, cfg, [{n: v.detach() for n, v in p.items()} for p in layers],
                     xs, mask, cut, size=2)
    for aux, _, _ in ranks:
        assert abs(aux - want.item()) < 1e-12 * want.item()
    for i, (out, _) in enumerate(whole):
        assert _rel(torch.cat([r[1][i] for r in ranks], dim=1), out.detach()) < 1e-12
        summed = ranks[0][2][i] + ranks[1][2][i]  # the gradient all-reduce over SP sums shares
        assert _rel(summed, layers[i]["router"].grad) < 1e-10
