"""Attention sinks (gpt-oss: a learned logit per query head in every query's softmax denominator,
its column dropped), exact in float64 for every algorithm against a one-process reference written
from the definition (transformers' `eager_attention_forward`: the scores with the sink column, a
softmax, the column dropped): out, dq, dk, dv and dsinks (each rank's part, summed over the group),
at P = 2, 3 and 4, in every layout, causal and bidirectional, with windows, packed documents and
uneven lengths, MHA and GQA (K,V heads split, replicated and the unequal head ranges at P = 3).
The ledger holds every rank's bytes to the analytic count: sinks move no byte. `sinks=None` is the
attention without sinks, and a sink of -inf gives it bit for bit (the gate is exactly 1). The
checkpointing modes that run an attention themselves (sc++, seq-attn) stay exact with sinks.

One gang round-trip per P runs every algorithm's cases (a covering design of layouts, relations and
head counts, the same on every run; the inputs change with the seed): a few seconds a world.
`make test` runs P = 4 and half the design (`cases`); `make test-full` P = 2, 3, 4 and all of it."""

from __future__ import annotations

import functools
import itertools
import math

import pytest
import torch

from seqpar import algorithms
from seqpar.algorithms.base import Geometry
from seqpar.model import checkpointing
from seqpar.rules.shape import TOLERANCE, AttnShape
from tests.resources import FULL

ALGORITHMS = {  # name -> options at P (as the documents test runs them)
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
B, D = 2, 4

Case = tuple  # (algorithm, layout, causal, N, cu_seqlens or None, window or None, H, Hkv)


def relations(world: int) -> list[tuple[bool, int, tuple[int, ...] | None, int | None]]:
    """(causal, N, cu_seqlens, window): causal, a causal window, documents with a window,
    bidirectional with a window and with documents, and uneven lengths (N - 1, three documents)."""
    n, u = 8 * world, 2 * world
    docs = (0, u, n - u, n)
    return [(True, n, None, None), (True, n, None, 5), (True, n, docs, 3),
            (False, n, None, 7), (False, n, docs, None), (True, n - 1, (0, 3, u + 1, n - 1), None)]


def cases(world: int) -> list[Case]:
    """Every algorithm in a covering design of layout x relation x heads: layout l meets relation
    j when l + j is even (each relation two layouts, each layout three relations), with MHA or GQA
    by (l + j) / 2, so every layout and every relation meets both. `make test` keeps half, (l + j)
    % 4 == 2 ((a + j) % 2) for algorithm a: each relation once an algorithm, every layout and both
    head kinds in each, every pair of the design in two algorithms running one after the other."""
    out = []
    for (a, name), (lay, layout), (j, (causal, n, cu, window)) in itertools.product(
            enumerate(ALGORITHMS), enumerate(LAYOUTS), enumerate(relations(world))):
        if (lay + j) % 2 == 0 and (FULL or (lay + j) % 4 == 2 * ((a + j) % 2)):
            h, hkv = HEADS[world][(lay + j) // 2 % 2]
            out.append((name, layout, causal, n, cu, window, h, hkv))
    return out


def inputs(case: Case, seed: int) -> dict[str, torch.Tensor]:
    """Full-sequence float64 q, k, v, dout and sinks (near the lse's scale: the gate spans (0, 1))."""
    *_, n, _, _, h, hkv = case
    g = torch.Generator().manual_seed(seed)
    x = {"q": (B, n, h, D), "k": (B, n, hkv, D), "v": (B, n, hkv, D), "dout": (B, n, h, D)}
    out = {name: torch.randn(*s, generator=g, dtype=torch.float64) for name, s in x.items()}
    out["sinks"] = 1.5 * torch.randn(h, generator=g, dtype=torch.float64) + 1.0
    return out


def keep_of(case: Case) -> torch.Tensor:
    """(N, N) True where query i sees key j, from the definition: same document, causal, window."""
    _, _, causal, n, cu, window, _, _ = case
    t = torch.arange(n)
    bounds = torch.tensor(cu or (0, n))
    doc = torch.repeat_interleave(torch.arange(len(bounds) - 1), bounds[1:] - bounds[:-1])
    keep = doc[:, None] == doc[None, :]
    if causal:
        keep &= t[:, None] >= t[None, :]
    if window is not None:
        keep &= (t[:, None] - t[None, :]).abs() < window
    return keep


def sink_attention(q, k, v, sinks, keep):
    """gpt-oss's eager attention: the scores with each head's sink as one more column, a softmax,
    the column dropped."""
    h = q.shape[2]
    kx, vx = (t.repeat_interleave(h // k.shape[2], dim=2) for t in (k, v))
    scores = torch.einsum("bqhd,bkhd->bhqk", q, kx) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~keep, float("-inf"))
    column = sinks.view(1, -1, 1, 1).expand(*scores.shape[:3], 1)
    probs = torch.cat([scores, column], dim=-1).softmax(dim=-1)[..., :-1]
    return torch.einsum("bhqk,bkhd->bqhd", probs, vx)


def reference(x: dict[str, torch.Tensor], keep: torch.Tensor, sinks: bool = True
              ) -> dict[str, torch.Tensor]:
    """out and the gradients of the one-process attention (sinks=False: a sink of -inf)."""
    leaves = {n: x[n].clone().requires_grad_() for n in ("q", "k", "v", "sinks")}
    s = leaves["sinks"] if sinks else torch.full_like(x["sinks"], float("-inf"))
    out = sink_attention(leaves["q"], leaves["k"], leaves["v"], s, keep)
    out.backward(x["dout"])
    got = {"out": out.detach(), **{f"d{n}": t.grad for n, t in leaves.items()}}
    return got if sinks else {n: t for n, t in got.items() if n != "dsinks"}


def error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max()) / max(float(want.abs().max()), 1e-4)


# --------------------------------------------------------------------------------- on the ranks
def _call(env, attn, case: Case, x: dict[str, torch.Tensor], sinks: torch.Tensor | None):
    """This rank's shards of one call's out and gradients, its positions and its bytes."""
    _, _, _, n, cu, _, _, _ = case
    pos = attn.positions(n, cu)
    local = {name: x[name].index_select(1, pos) for name in ("q", "k", "v", "dout")}
    q, k, v = (local[name].clone().requires_grad_() for name in ("q", "k", "v"))
    s = None if sinks is None else sinks.clone().requires_grad_()
    with algorithms.recording() as ledger:
        out = attn(q, k, v, cu_seqlens=cu, sinks=s)
        out.backward(local["dout"])
    got = {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}
    if s is not None:
        got["dsinks"] = s.grad
    return pos, got, {p: ledger.total(phase=p) for p in ("forward", "backward")}


def _analytic(attn, case: Case, rank: int) -> dict[str, int]:
    name, layout, causal, n, cu, window, h, hkv = case
    shape = AttnShape(B, n, h, hkv, D, 8)
    geometry = Geometry.of(shape, attn.algo.world, layout, causal, cu, window)
    return algorithms.get(name).bytes_of_rank(shape, attn.algo.world, ALGORITHMS[name](
        attn.algo.world), rank, geometry)


def _rank_runs(env, world: int, seed: int) -> list[dict]:
    """Every case with sinks; for each algorithm's first case also sinks=None and sinks=-inf."""
    out, seen = [], set()
    for i, case in enumerate(cases(world)):
        name, layout, causal, _, _, window, _, _ = case
        attn = algorithms.build_attention(name, causal=causal, layout=layout, window=window,
                                          group=env.group(world), **ALGORITHMS[name](world))
        x = inputs(case, seed + i)
        pos, got, sent = _call(env, attn, case, x, x["sinks"])
        row = {"pos": pos, "got": got, "sent": sent, "want": _analytic(attn, case, env.rank)}
        if name not in seen:
            seen.add(name)
            _, row["none"], row["none_sent"] = _call(env, attn, case, x, None)
            _, row["neginf"], _ = _call(env, attn, case, x, torch.full_like(x["sinks"], -math.inf))
        out.append(row)
    return out


def _unshard(rows: list[dict], key: str, n: int) -> dict[str, torch.Tensor]:
    """The ranks' shards of `key` as full-sequence tensors; dsinks summed over the ranks."""
    full = {}
    for name in rows[0][key]:
        if name == "dsinks":
            full[name] = sum(r[key][name] for r in rows)
            continue
        like = rows[0][key][name]
        t = torch.zeros(like.shape[0], n, *like.shape[2:], dtype=like.dtype)
        for r in rows:
            t[:, r["pos"]] = r[key][name]
        full[name] = t
    return full


@pytest.mark.multirank
@pytest.mark.parametrize("world", [pytest.param(2, marks=pytest.mark.slow),
                                   pytest.param(3, marks=pytest.mark.slow), 4])  # P = 4: make test
def test_sinks_exact_in_every_algorithm_layout_and_relation(gang, seed, world):
    per_rank = gang.run(_rank_runs, world, seed, size=world)
    failures = []
    for i, case in enumerate(cases(world)):
        rows = [ranks[i] for ranks in per_rank]
        n, keep, x = case[3], keep_of(case), inputs(case, seed + i)
        want = reference(x, keep)
        got = _unshard(rows, "got", n)
        errors = {name: error(got[name], want[name]) for name in want if name != "dsinks"}
        errors["dsinks"] = error(got["dsinks"], want["dsinks"])
        failures += [f"{case}: {name} error {e:.1e}" for name, e in errors.items()
                     if not e <= TOLERANCE["float64"]]
        for r, row in enumerate(rows):  # sinks send nothing: every rank's bytes are the count
            if row["sent"] != row["want"]:
                failures.append(f"{case} rank {r}: bytes {row['sent']} != {row['want']}")
        if "none" not in rows[0]:
            continue
        plain = reference(x, keep, sinks=False)
        none, neginf = _unshard(rows, "none", n), _unshard(rows, "neginf", n)
        failures += [f"{case} sinks=None: {name} error {error(none[name], plain[name]):.1e}"
                     for name in plain if not error(none[name], plain[name]) <= TOLERANCE["float64"]]
        failures += [f"{case}: sinks=-inf is not sinks=None bit for bit in {name}"
                     for name in plain if not torch.equal(none[name], neginf[name])]
        failures += [f"{case}: sinks=-inf gives dsinks {neginf['dsinks']}"
                     for _ in [0] if bool(neginf["dsinks"].any())]
        failures += [f"{case} rank {r}: bytes with sinks {row['sent']} != without "
                     f"{row['none_sent']}" for r, row in enumerate(rows)
                     if row["sent"] != row["none_sent"]]
    assert not failures, "\n".join(failures)


# ------------------------------------------------------------------------ checkpointing modes
MODES = (("none", 0.0), ("full", 0.0), ("sc++", 0.0), ("sequence", 0.5), ("sc++,sequence", 0.5),
         ("seq-attn", 0.5), ("seq-attn", 0.25))
# (algorithm, layout, causal, cu_seqlens, window, H, Hkv, modes): seq-attn where it runs (ring or
# burst; stripe at any fraction, zigzag at 1/2), over packed documents and a window
BLOCKS = (("ring", "stripe", True, (0, 5, 12, 32), None, 4, 2, MODES),
          ("burst", "zigzag", True, None, 5, 4, 4, MODES[:6]),
          ("ulysses", "contiguous", True, (0, 8, 24, 32), 3, 4, 2, MODES[:5]))
BLOCK_N, WIDTH, WEIGHTS = 32, 8, ("wq", "wk", "wv", "wo")


def block_inputs(spec: tuple, seed: int) -> dict[str, torch.Tensor]:
    """x, the upstream gradient, RoPE-like per-token factors, the weights and the sinks."""
    h, hkv = spec[5], spec[6]
    g = torch.Generator().manual_seed(seed)
    shapes = {"x": (B, BLOCK_N, WIDTH), "dy": (B, BLOCK_N, WIDTH), "cos": (1, BLOCK_N, 1, 1),
              "sin": (1, BLOCK_N, 1, 1), "wq": (WIDTH, h * D), "wk": (WIDTH, hkv * D),
              "wv": (WIDTH, hkv * D), "wo": (h * D, WIDTH), "sinks": (h,)}
    return {n: torch.randn(*s, generator=g, dtype=torch.float64) for n, s in shapes.items()}


def block_parts(w: dict[str, torch.Tensor], h: int, hkv: int):
    """pre (the projections, scaled per token as RoPE would) and post (projection, residual)."""
    def pre(x, cos, sin):
        b, s, _ = x.shape
        return ((x @ w["wq"]).view(b, s, h, D) * cos, (x @ w["wk"]).view(b, s, hkv, D) * sin,
                (x @ w["wv"]).view(b, s, hkv, D))

    def post(x, a):
        return x + a.flatten(2) @ w["wo"]
    return pre, post


def block_reference(spec: tuple, x: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    name, layout, causal, cu, window, h, hkv, _ = spec
    leaves = {n: x[n].clone().requires_grad_() for n in ("x", *WEIGHTS, "sinks")}
    pre, post = block_parts(leaves, h, hkv)
    q, k, v = pre(leaves["x"], x["cos"], x["sin"])
    keep = keep_of((name, layout, causal, BLOCK_N, cu, window, h, hkv))
    post(leaves["x"], sink_attention(q, k, v, leaves["sinks"], keep)).backward(x["dy"])
    return {n: t.grad for n, t in leaves.items()}


def _block_runs(env, world: int, seed: int) -> list[list[dict]]:
    """Per block spec, per mode: this rank's dx shard (and positions), its weights' and sinks'
    gradient parts."""
    out = []
    for i, spec in enumerate(BLOCKS):
        name, layout, causal, cu, window, h, hkv, modes = spec
        attn = algorithms.build_attention(name, causal=causal, layout=layout, window=window,
                                          group=env.group(world), **ALGORITHMS[name](world))
        attend = attn if cu is None else functools.partial(attn, cu_seqlens=cu)
        pos = attn.positions(BLOCK_N, cu)
        x = block_inputs(spec, seed + i)
        runs = []
        for mode, fraction in modes:
            leaves = {n: x[n].clone().requires_grad_() for n in (*WEIGHTS, "sinks")}
            xl = x["x"].index_select(1, pos).requires_grad_()
            pre, post = block_parts(leaves, h, hkv)
            y = checkpointing.run_block(pre, post, attend, xl, x["cos"][:, pos], x["sin"][:, pos],
                                        mode, fraction, sinks=leaves["sinks"])
            y.backward(x["dy"].index_select(1, pos))
            runs.append({"pos": pos, "x": xl.grad, **{n: t.grad for n, t in leaves.items()}})
        out.append(runs)
    return out


@pytest.mark.multirank
def test_sinks_exact_in_every_checkpointing_mode(gang, seed):
    world = 4
    per_rank = gang.run(_block_runs, world, seed, size=world)
    failures = []
    for i, spec in enumerate(BLOCKS):
        want = block_reference(spec, block_inputs(spec, seed + i))
        for j, (mode, fraction) in enumerate(spec[-1]):
            rows = [ranks[i][j] for ranks in per_rank]
            dx = torch.zeros_like(want["x"])
            for r in rows:
                dx[:, r["pos"]] = r["x"]
            got = {"x": dx, **{n: sum(r[n] for r in rows) for n in (*WEIGHTS, "sinks")}}
            failures += [f"{spec[:5]} {mode} F={fraction}: d{n} error {error(got[n], want[n]):.1e}"
                         for n in want if not error(got[n], want[n]) <= TOLERANCE["float64"]]
    assert not failures, "\n".join(failures)

