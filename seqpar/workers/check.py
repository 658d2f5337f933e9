"""Correctness check of a distributed attention against the single-process float64 reference.

`rank_run` runs on every rank of a gang: it deals the full random inputs into its layout shard, runs
forward and backward under a ledger, and returns its shards of out, dq, dk, dv. `evaluate` unshards
them and holds them against torch's scaled_dot_product_attention in float64 on the unsharded inputs,
and the ledger against the algorithm's analytic bytes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from seqpar import algorithms
from seqpar.algorithms import layouts
from seqpar.algorithms.base import DTYPES, Mask
from seqpar.case import Case
from seqpar.workers.bench import _sync

# relative tolerance (max |error| / max |reference|) by dtype
TOLERANCE = {"float64": 1e-10, "float32": 2e-5, "bfloat16": 3e-2, "float16": 5e-3}
GRADS = ("out", "dq", "dk", "dv")


@dataclass
class RankResult:
    shards: dict[str, torch.Tensor]
    bytes_sent: dict[str, int]
    flops: dict[str, float]
    ledger: dict
    seconds: float


@dataclass
class CheckResult:
    case: Case
    errors: dict[str, float]
    bytes_measured: dict[str, int]
    bytes_expected: dict[str, int]
    flops_per_rank: list[float]
    seconds: float
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


def make_inputs(case: Case) -> dict[str, torch.Tensor]:
    """Full-sequence q, k, v and the upstream gradient, float64, drawn from case.seed."""
    g = torch.Generator().manual_seed(case.seed)
    b, n, h, hkv, d = case.batch, case.seq_len, case.heads, case.kv_heads, case.head_dim
    return {
        "q": torch.randn(b, n, h, d, generator=g, dtype=torch.float64),
        "k": torch.randn(b, n, hkv, d, generator=g, dtype=torch.float64),
        "v": torch.randn(b, n, hkv, d, generator=g, dtype=torch.float64),
        "dout": torch.randn(b, n, h, d, generator=g, dtype=torch.float64),
    }


def rank_run(env, case: Case) -> RankResult:
    """On one rank of a gang (see platform.localgang): shard, run forward + backward, report."""
    dtype = DTYPES[case.dtype]
    full = make_inputs(case)
    cu = case.cu_seqlens or None
    local = {name: layouts.shard(t, case.layout, env.rank, case.world, cu_seqlens=cu)
             .to(env.device, dtype) for name, t in full.items()}
    q, k, v = (local[n].requires_grad_() for n in ("q", "k", "v"))
    attn = algorithms.build_attention(case.algorithm, causal=case.causal, layout=case.layout,
                                      group=env.group(case.world), mesh=env.mesh,
                                      window=case.window, **dict(case.options))
    device = torch.device(env.device)
    with algorithms.recording() as ledger:
        _sync(device)  # on CUDA the clock must start after the inputs landed and stop after the
        start = time.perf_counter()  # kernels ran, not when they were queued
        out = attn(q, k, v, cu_seqlens=cu) if cu else attn(q, k, v)
        out.backward(local["dout"])
        _sync(device)
        seconds = time.perf_counter() - start
    shards = {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}
    return RankResult(
        shards={n: t.cpu() for n, t in shards.items()},
        bytes_sent={p: ledger.total(phase=p) for p in ("forward", "backward")},
        flops=dict(ledger.flops), ledger=ledger.to_dict(), seconds=seconds,
    )


def mesh_key(case: Case, nodes: tuple[int, ...] | None = None) -> tuple:
    """The LocalGang mesh key (grid, axes, nodes) of a case: its algorithm's grid."""
    grid = algorithms.grid_for(case.algorithm, case.world, nodes, **dict(case.options))
    return grid, algorithms.get(case.algorithm).axes, nodes


def run_case(gang, case: Case, nodes: tuple[int, ...] | None = None) -> list[RankResult]:
    """`rank_run` on the first case.world ranks of a LocalGang, on the case's mesh (real process
    groups per axis, built once per grid on every rank of the gang)."""
    return gang.run(rank_run, case, size=case.world, mesh=mesh_key(case, nodes))


def rank_run_many(env, cases: list[Case]) -> list[RankResult]:
    """`rank_run` of several cases in one gang round-trip (they share one mesh key)."""
    return [rank_run(env, c) for c in cases]


def run_cases(gang, cases: list[Case]) -> list[list[RankResult]]:
    """`run_case` of several cases of one algorithm, options and world in one round-trip; per case
    the ranks' results."""
    first = cases[0]
    assert all(mesh_key(c) == mesh_key(first) and c.world == first.world for c in cases)
    per_rank = gang.run(rank_run_many, cases, size=first.world, mesh=mesh_key(first))
    return [[rank[i] for rank in per_rank] for i in range(len(cases))]


def failures_of(gang, cases: list[Case]) -> list[str]:
    """`run_cases`, then `evaluate`: one line per case that is not exact (empty: all are)."""
    out = []
    for case, results in zip(cases, run_cases(gang, cases), strict=True):
        result = evaluate(case, results)
        if not result.ok:
            out.append(f"{case.label()} cu={case.cu_seqlens}: {result.failures}")
    return out


def reference_mask(case: Case) -> torch.Tensor | None:
    """The explicit boolean mask (N, N) of documents and window (True: visible), written from the
    definition, independently of `layouts.Relation`; None for plain causal or full."""
    if not case.cu_seqlens and case.window is None:
        return None
    n = case.seq_len
    t = torch.arange(n)
    cu = torch.tensor(case.cu_seqlens or (0, n))
    doc = torch.repeat_interleave(torch.arange(len(cu) - 1), cu[1:] - cu[:-1])
    keep = doc[:, None] == doc[None, :]
    if case.causal:
        keep &= t[:, None] >= t[None, :]
    if case.window is not None:
        keep &= (t[:, None] - t[None, :]).abs() < case.window
    return keep


def reference(case: Case) -> dict[str, torch.Tensor]:
    """out, dq, dk, dv of attention on the unsharded float64 inputs (SDPA; with documents or a
    window, under an explicit boolean mask)."""
    full = make_inputs(case)
    q, k, v = (full[n].clone().requires_grad_() for n in ("q", "k", "v"))
    mask = reference_mask(case)
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
        is_causal=case.causal and mask is None, enable_gqa=case.heads != case.kv_heads,
    ).transpose(1, 2)
    out.backward(full["dout"])
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def evaluate(case: Case, results: list[RankResult]) -> CheckResult:
    ref = reference(case)
    errors = {}
    for name in GRADS:
        got = layouts.unshard([r.shards[name] for r in results], case.layout,
                              cu_seqlens=case.cu_seqlens or None).double()
        # relative to max |reference|; a gradient that vanishes (dq, dk at window 1: every query
        # sees only itself) is held to its absolute error over 1e-4, not to rounding noise over noise
        scale = max(float(ref[name].abs().max()), 1e-4)
        errors[name] = float((got - ref[name]).abs().max()) / scale
    measured = {p: max(r.bytes_sent[p] for r in results) for p in ("forward", "backward")}
    mask = Mask.of(case.shape, case.world, case.layout, case.causal, case.cu_seqlens or None,
                   case.window)  # net of the transfers the rings skip (documents, windows)
    expected = algorithms.expected_bytes(case.algorithm, case.shape, case.world,
                                         layout=case.layout, causal=case.causal,
                                         cu_seqlens=case.cu_seqlens or None, window=case.window,
                                         **dict(case.options))
    failures = [f"{n} error {e:.1e} > {TOLERANCE[case.dtype]:.0e}"
                for n, e in errors.items() if not e <= TOLERANCE[case.dtype]]
    spec = algorithms.get(case.algorithm)
    for r, res in enumerate(results):
        want = spec.bytes_of_rank(case.shape, case.world, dict(case.options), r, mask)
        for p in ("forward", "backward"):
            if res.bytes_sent[p] != want[p]:
                failures.append(f"rank {r} {p} bytes {res.bytes_sent[p]} != {want[p]}")
    return CheckResult(case, errors, measured, expected,
                       [sum(r.flops.values()) for r in results],
                       max(r.seconds for r in results), failures)
