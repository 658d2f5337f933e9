"""Multi-head latent attention under SP, exact in float64 against a one-process reference written
from the definition.

A V head dim of its own (MLA: queries and keys 192 wide, values 128): every algorithm at P = 2, 3
and 4, in every layout, causal and bidirectional, with windows, documents and uneven lengths, MHA
and GQA (K,V heads split, replicated and the unequal head ranges at P = 3), V narrower and wider
than Q/K, with and without sinks: out, dq, dk, dv (and dsinks), and every rank's bytes against the
analytic count (K and V bytes differ now). One gang round-trip per P runs every case; `make
test` runs P = 4 and half the covering design (`met`: each algorithm every relation once).
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch

from seqpar import algorithms
from seqpar.algorithms.base import Geometry
from seqpar.algorithms.latent import LatentAttention, up_project
from seqpar.errors import ConfigError
from seqpar.model import Transformer
from seqpar.rules.model import ModelConfig
from seqpar.rules.rope import Rope
from seqpar.rules.shape import TOLERANCE, AttnShape
from tests.resources import FULL

ALGORITHMS = {  # name -> options at P
    "allgather": lambda p: {},
    "ulysses": lambda p: {},
    "ring": lambda p: {},
    "usp": lambda p: {"dhp": 2} if p % 2 == 0 else {"dhp": p},
    "double_ring": lambda p: {"inner_ring": 2} if p % 2 == 0 else {},
    "wallfacer": lambda p: {"team_size": 2} if p >= 4 else {"team_size": 1},
    "burst": lambda p: {"ranks_per_node": 2} if p % 2 == 0 else {},
}
LAYOUTS = ("contiguous", "zigzag", "stripe", "balanced")
HEADS = {3: ((6, 6), (6, 2)), 2: ((4, 4), (4, 2)), 4: ((4, 4), (4, 2))}  # (H, Hkv): MHA, GQA
WIDTHS = ((6, 4), (3, 5))  # (Q/K head dim, V head dim): MLA's narrower V, and a wider one
B = 2
# P = 4 (usp's dhp 2, the double ring's inner rings, burst's nodes, WallFacer's teams) in make
# test; P = 2 and 3 (unequal GQA head ranges) in the full matrix
WORLDS = (pytest.param(2, marks=pytest.mark.slow), pytest.param(3, marks=pytest.mark.slow), 4)

Case = tuple  # (algorithm, layout, causal, N, cu_seqlens, window, H, Hkv, D, Dv, sinks)


def relations(world: int) -> list[tuple[bool, int, tuple[int, ...] | None, int | None]]:
    """(causal, N, cu_seqlens, window): causal, a causal window, documents with a window,
    bidirectional with a window and with documents, and uneven lengths (three documents)."""
    n, u = 8 * world, 2 * world
    docs = (0, u, n - u, n)
    return [(True, n, None, None), (True, n, None, 5), (True, n, docs, 3),
            (False, n, None, 7), (False, n, docs, None), (True, n - 1, (0, 3, u + 1, n - 1), None)]


def met(a: int, lay: int, j: int) -> bool:
    """Whether algorithm a (its index) meets layout `lay` with relation j: the covering design
    (make test-full) meets them where lay + j is even; make test keeps half of that, (lay + j) %
    4 == 2 ((a + j) % 2): each relation once an algorithm, every layout and both head kinds in
    each, and every pair of the design in two algorithms running one after the other."""
    return (lay + j) % 2 == 0 and (FULL or (lay + j) % 4 == 2 * ((a + j) % 2))


def cases(world: int) -> list[Case]:
    """Every algorithm in a covering design of layout x relation (`met`); heads, widths and sinks
    turn with (l + j) / 2 and j, so each meets each."""
    out = []
    for (a, name), (lay, layout), (j, (causal, n, cu, window)) in itertools.product(
            enumerate(ALGORITHMS), enumerate(LAYOUTS), enumerate(relations(world))):
        if met(a, lay, j):
            h, hkv = HEADS[world][(lay + j) // 2 % 2]
            d, dv = WIDTHS[j % 2]
            out.append((name, layout, causal, n, cu, window, h, hkv, d, dv, j % 3 == 0))
    return out


def inputs(case: Case, seed: int) -> dict[str, torch.Tensor]:
    *_, n, _, _, h, hkv, d, dv, _ = case
    g = torch.Generator().manual_seed(seed)
    x = {"q": (B, n, h, d), "k": (B, n, hkv, d), "v": (B, n, hkv, dv), "dout": (B, n, h, dv)}
    out = {name: torch.randn(*s, generator=g, dtype=torch.float64) for name, s in x.items()}
    out["sinks"] = 1.5 * torch.randn(h, generator=g, dtype=torch.float64) + 1.0
    return out


def keep_of(case: Case) -> torch.Tensor:
    """(N, N) True where query i sees key j: same document, causal, window."""
    _, _, causal, n, cu, window, *_ = case
    t = torch.arange(n)
    bounds = torch.tensor(cu or (0, n))
    doc = torch.repeat_interleave(torch.arange(len(bounds) - 1), bounds[1:] - bounds[:-1])
    keep = doc[:, None] == doc[None, :]
    if causal:
        keep &= t[:, None] >= t[None, :]
    if window is not None:
        keep &= (t[:, None] - t[None, :]).abs() < window
    return keep


def reference(case: Case, x: dict[str, torch.Tensor], leaves: bool = True
              ) -> dict[str, torch.Tensor]:
    """out and every gradient of the one-process attention: softmax(q kᵀ / sqrt(D)) v, with the
    sink column where the case has sinks (leaves=False: x's tensors as they are, their gradients
    left on whatever they came from)."""
    sinks = case[-1]
    names = ("q", "k", "v", "sinks")
    leaves = {n: x[n].clone().requires_grad_() if leaves else x[n] for n in names}
    q, k, v = leaves["q"], leaves["k"], leaves["v"]
    kx, vx = (t.repeat_interleave(q.shape[2] // k.shape[2], dim=2) for t in (k, v))
    scores = torch.einsum("bqhd,bkhd->bhqk", q, kx) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~keep_of(case), float("-inf"))
    column = (leaves["sinks"] if sinks else torch.full_like(x["sinks"], float("-inf")))
    column = column.view(1, -1, 1, 1).expand(*scores.shape[:3], 1)
    probs = torch.cat([scores, column], dim=-1).softmax(dim=-1)[..., :-1]
    out = torch.einsum("bhqk,bkhd->bqhd", probs, vx)
    out.backward(x["dout"])
    got = {"out": out.detach(), **{f"d{n}": leaves[n].grad for n in ("q", "k", "v")
                                   if leaves[n].is_leaf}}
    if sinks:
        got["dsinks"] = leaves["sinks"].grad
    return got


def error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max()) / max(float(want.abs().max()), 1e-4)


def analytic(case: Case, world: int, rank: int) -> dict[str, int]:
    name, layout, causal, n, cu, window, h, hkv, d, dv, _ = case
    shape = AttnShape(B, n, h, hkv, d, 8, dv)
    geometry = Geometry.of(shape, world, layout, causal, cu, window)
    return algorithms.get(name).bytes_of_rank(shape, world, ALGORITHMS[name](world), rank,
                                              geometry)


# --------------------------------------------------------------------------------- on the ranks
def _rank_runs(env, world: int, seed: int) -> list[dict]:
    out = []
    for i, case in enumerate(cases(world)):
        name, layout, causal, n, cu, window, *_, sinks = case
        attn = algorithms.build_attention(name, causal=causal, layout=layout, window=window,
                                          group=env.group(world), **ALGORITHMS[name](world))
        x = inputs(case, seed + i)
        pos = attn.positions(n, cu)
        local = {k: x[k].index_select(1, pos) for k in ("q", "k", "v", "dout")}
        q, k, v = (local[k].clone().requires_grad_() for k in ("q", "k", "v"))
        s = x["sinks"].clone().requires_grad_() if sinks else None
        with algorithms.recording() as ledger:
            o = attn(q, k, v, cu_seqlens=cu, sinks=s)
            o.backward(local["dout"])
        got = {"out": o.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}
        if s is not None:
            got["dsinks"] = s.grad
        out.append({"pos": pos, "got": got,
                    "sent": {p: ledger.total(phase=p) for p in ("forward", "backward")},
                    "want": analytic(case, world, env.rank)})
    return out


def unshard(rows: list[dict], n: int, summed: tuple[str, ...] = ("dsinks",)
            ) -> dict[str, torch.Tensor]:
    """The ranks' shards as full-sequence tensors; the weights' parts (`summed`) summed."""
    full = {}
    for name, like in rows[0]["got"].items():
        if name in summed:
            full[name] = sum(r["got"][name] for r in rows)
            continue
        t = torch.zeros(like.shape[0], n, *like.shape[2:], dtype=like.dtype)
        for r in rows:
            t[:, r["pos"]] = r["got"][name]
        full[name] = t
    return full


@pytest.mark.multirank
@pytest.mark.parametrize("world", WORLDS)
def test_v_head_dim_of_its_own_is_exact_in_every_algorithm(gang, seed, world):
    per_rank = gang.run(_rank_runs, world, seed, size=world)
    failures = []
    for i, case in enumerate(cases(world)):
        rows = [ranks[i] for ranks in per_rank]
        want = reference(case, inputs(case, seed + i))
        got = unshard(rows, case[3])
        failures += [f"{case}: {name} error {error(got[name], want[name]):.1e}" for name in want
                     if not error(got[name], want[name]) <= TOLERANCE["float64"]]
        failures += [f"{case} rank {r}: bytes {row['sent']} != {row['want']}"
                     for r, row in enumerate(rows) if row["sent"] != row["want"]]
    assert not failures, "\n".join(failures)


# ----------------------------------------------------------------- the latent on the ring family
LATENT = {"ring": lambda p: {}, "double_ring": ALGORITHMS["double_ring"],
          "usp": ALGORITHMS["usp"], "burst": ALGORITHMS["burst"],
          "wallfacer": ALGORITHMS["wallfacer"]}
NOPE, ROPE, DV, RANK = 4, 2, 3, 5  # q/k 6 wide, v 3, a latent of 5 + 2 values a token


def latent_cases(world: int) -> list[Case]:
    """The latent-carrying algorithms over the same covering design (MHA: every head reads the
    rebuilt K,V; heads divisible by usp's dhp)."""
    h = HEADS[world][0][0]
    return [(name, layout, causal, n, cu, window, h, h, NOPE + ROPE, DV, j % 3 == 0)
            for (a, name), (lay, layout), (j, (causal, n, cu, window)) in itertools.product(
                enumerate(LATENT), enumerate(LAYOUTS), enumerate(relations(world)))
            if met(a, lay, j)]


def latent_inputs(case: Case, seed: int) -> dict[str, torch.Tensor]:
    *_, n, _, _, h, _, _, _, _ = case
    g = torch.Generator().manual_seed(seed)
    x = {"q": (B, n, h, NOPE + ROPE), "c": (B, n, 1, RANK), "k_rope": (B, n, 1, ROPE),
         "wkv_b": (h * (NOPE + DV), RANK), "dout": (B, n, h, DV)}
    out = {name: torch.randn(*s, generator=g, dtype=torch.float64) for name, s in x.items()}
    out["sinks"] = 1.5 * torch.randn(h, generator=g, dtype=torch.float64) + 1.0
    return out


def latent_reference(case: Case, x: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The one-process attention over K,V rebuilt from the whole latent (the model's kv path):
    out, dq, dc, dk_rope, dwkv_b (and dsinks)."""
    leaves = {n: x[n].clone().requires_grad_() for n in ("q", "c", "k_rope", "wkv_b", "sinks")}
    k, v = up_project(torch.cat([leaves["c"], leaves["k_rope"]], dim=-1), leaves["wkv_b"],
                      case[6], DV)
    got = reference(case, {**x, "q": leaves["q"], "k": k, "v": v, "sinks": leaves["sinks"]},
                    leaves=False)
    return {"out": got["out"], **{f"d{n}": leaves[n].grad for n in leaves
                                  if n != "sinks" or case[-1]}}


def _latent_runs(env, world: int, seed: int) -> list[dict]:
    out = []
    for i, case in enumerate(latent_cases(world)):
        name, layout, causal, n, cu, window, *_, sinks = case
        attn = LatentAttention(algorithms.build_attention(
            name, causal=causal, layout=layout, window=window, group=env.group(world),
            **LATENT[name](world)))
        x = latent_inputs(case, seed + i)
        pos = attn.positions(n, cu)
        leaves = {k: x[k].index_select(1, pos).requires_grad_() for k in ("q", "c", "k_rope")}
        w = x["wkv_b"].clone().requires_grad_()
        s = x["sinks"].clone().requires_grad_() if sinks else None
        with algorithms.recording() as ledger:
            o = attn(*leaves.values(), wkv_b=w, cu_seqlens=cu, sinks=s)
            o.backward(x["dout"].index_select(1, pos))
        got = {"out": o.detach(), **{f"d{k}": t.grad for k, t in leaves.items()}, "dwkv_b": w.grad}
        if s is not None:
            got["dsinks"] = s.grad
        shape = AttnShape(B, n, case[6], case[6], NOPE + ROPE, 8, DV)
        geometry = Geometry.of(shape, world, layout, causal, cu, window)
        want = algorithms.get(name).latent_bytes(shape, world, LATENT[name](world), env.rank,
                                                 RANK + ROPE, geometry)
        out.append({"pos": pos, "got": got, "want": want,
                    "sent": {p: ledger.total(phase=p) for p in ("forward", "backward")}})
    return out


@pytest.mark.multirank
@pytest.mark.parametrize("world", WORLDS)
def test_the_latent_on_the_ring_family_is_exact(gang, seed, world):
    """mla_pass latent: out and the gradients of q, the latent, its RoPE key and wkv_b (each rank's
    part, summed) equal the one-process attention over the rebuilt K,V; every rank's bytes equal
    the latent count."""
    per_rank = gang.run(_latent_runs, world, seed, size=world)
    failures = []
    for i, case in enumerate(latent_cases(world)):
        rows = [ranks[i] for ranks in per_rank]
        want = latent_reference(case, latent_inputs(case, seed + i))
        got = unshard(rows, case[3], summed=("dsinks", "dwkv_b"))
        failures += [f"{case}: {name} error {error(got[name], want[name]):.1e}" for name in want
                     if not error(got[name], want[name]) <= TOLERANCE["float64"]]
        failures += [f"{case} rank {r}: bytes {row['sent']} != {row['want']}"
                     for r, row in enumerate(rows) if row["sent"] != row["want"]]
    assert not failures, "\n".join(failures)


# ------------------------------------------------------------------------------ in the model
TINY_V3 = ModelConfig(
    vocab=64, hidden=32, layers=2, heads=4, kv_heads=4, ffn=48, norm_eps=1e-6,
    family="deepseek_v3", head_dim=12, q_lora_rank=16, kv_lora_rank=8, qk_rope_dim=4,
    v_head_dim=6, rope_interleave=True, attn_scale=0.3,
    rope=Rope(theta=10000.0, kind="yarn", factor=4.0, original_max=8, mscale=1.0,
              mscale_all_dim=1.0),
    experts=4, experts_per_tok=2, moe_ffn=8, shared_ffn=8, moe_layers=(1,),
    router="sigmoid_group", n_group=2, topk_group=1, routed_scale=2.0)
MODEL_RUNS = (  # (attention, layout, options, mla_pass, checkpoint)
    ("ring", "zigzag", {}, "latent", "sc++"),
    ("ring", "stripe", {}, "kv", "none"),
    ("usp", "zigzag", {"dhp": 2}, "latent", "full"),
    ("burst", "contiguous", {"ranks_per_node": 2}, "latent", "none"),
    ("double_ring", "stripe", {"inner_ring": 2}, "latent", "sequence"),
    ("wallfacer", "zigzag", {"team_size": 2}, "latent", "sc++"),
    ("ulysses", "zigzag", {}, "kv", "sc++"),
)


def _model_runs(env, tokens: torch.Tensor) -> list:
    out = []
    for attention, layout, opts, mla_pass, mode in MODEL_RUNS:
        net = Transformer(TINY_V3, attention=attention, layout=layout, group=env.group(4),
                          checkpoint=mode, dtype=torch.float64, seed=3, mla_pass=mla_pass, **opts)
        assert isinstance(net.attend, LatentAttention) == (mla_pass == "latent")
        loss = net.loss(tokens)
        loss.backward()
        out.append((loss.item(), net.full_grads()))
    return out


@pytest.mark.multirank
def test_an_mla_model_under_the_ring_family_equals_one_process(gang, seed):
    """A tiny DeepSeek-V3 (low-rank q, interleaved RoPE, YaRN, grouped sigmoid MoE) at P = 4:
    the latent on ring, usp, burst, the double ring and WallFacer, K,V on ring and ulysses, under
    checkpointing modes, give the one-process model's loss and every gradient."""
    tokens = torch.randint(0, TINY_V3.vocab, (2, 33), generator=torch.Generator().manual_seed(seed))
    net = Transformer(TINY_V3, dtype=torch.float64, seed=3)
    loss = net.loss(tokens)
    loss.backward()
    want = {k: p.grad for k, p in net.named_parameters() if p.grad is not None}
    for run, (got, grads) in zip(MODEL_RUNS, gang.run(_model_runs, tokens, size=4)[0],
                                 strict=True):
        assert abs(got - loss.item()) < 1e-10 * abs(loss.item()), (run, got, loss.item())
        assert grads.keys() == want.keys(), run
        for name, g in grads.items():
            err = ((g - want[name]).abs().max() / want[name].abs().max()).item()
            assert err < 1e-9, (run, name, err)


@pytest.mark.parametrize(("cfg", "attention", "kw", "words"), [
    (dataclasses.replace(TINY_V3, kv_lora_rank=0, q_lora_rank=0, qk_rope_dim=0, v_head_dim=0),
     "ring", {}, "needs a model with multi-head latent attention"),
    (TINY_V3, "ulysses", {}, "ulysses and allgather move K,V heads"),
    (TINY_V3, "ring", {"checkpoint": "seq-attn"}, "seq-attn"),
    (TINY_V3, "ring", {"mla_pass": "latents"}, "must be one of kv, latent")])
def test_a_bad_mla_pass_is_a_one_line_error(cfg, attention, kw, words):
    kw = {"mla_pass": "latent", **kw}
    with pytest.raises(ConfigError) as err:
        Transformer(cfg, attention=attention, **kw)
    assert words in str(err.value) and "mla_pass" in str(err.value)
    assert "\n" not in str(err.value)
