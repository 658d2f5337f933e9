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
from seqpar.algorithms.base import DTYPES
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
    local = {name: layouts.shard(t, case.layout, env.rank, case.world).to(env.device, dtype)
             for name, t in full.items()}
    q, k, v = (local[n].requires_grad_() for n in ("q", "k", "v"))
    attn = algorithms.build_attention(case.algorithm, causal=case.causal, layout=case.layout,
                                      group=env.group(case.world), mesh=env.mesh,
                                      **dict(case.options))
    device = torch.device(env.device)
    with algorithms.recording() as ledger:
        _sync(device)  # on CUDA the clock must start after the inputs landed and stop after the
        start = time.perf_counter()  # kernels ran, not when they were queued
        out = attn(q, k, v)
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


def reference(case: Case) -> dict[str, torch.Tensor]:
    """out, dq, dk, dv of plain attention on the unsharded float64 inputs."""
    full = make_inputs(case)
    q, k, v = (full[n].clone().requires_grad_() for n in ("q", "k", "v"))
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=case.causal,
        enable_gqa=case.heads != case.kv_heads,
    ).transpose(1, 2)
    out.backward(full["dout"])
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def evaluate(case: Case, results: list[RankResult]) -> CheckResult:
    ref = reference(case)
    errors = {}
    for name in GRADS:
        got = layouts.unshard([r.shards[name] for r in results], case.layout).double()
        errors[name] = float((got - ref[name]).abs().max() / ref[name].abs().max())
    measured = {p: max(r.bytes_sent[p] for r in results) for p in ("forward", "backward")}
    expected = algorithms.expected_bytes(case.algorithm, case.shape, case.world,
                                         **dict(case.options))
    failures = [f"{n} error {e:.1e} > {TOLERANCE[case.dtype]:.0e}"
                for n, e in errors.items() if not e <= TOLERANCE[case.dtype]]
    spec = algorithms.get(case.algorithm)
    for r, res in enumerate(results):
        want = spec.bytes_of_rank(case.shape, case.world, dict(case.options), r)
        for p in ("forward", "backward"):
            if res.bytes_sent[p] != want[p]:
                failures.append(f"rank {r} {p} bytes {res.bytes_sent[p]} != {want[p]}")
    return CheckResult(case, errors, measured, expected,
                       [sum(r.flops.values()) for r in results],
                       max(r.seconds for r in results), failures)
