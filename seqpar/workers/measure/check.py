"""Mode check (`seqpar check`, the multi-rank tests): a distributed attention against the
single-process float64 reference.

`rank_run` runs on every rank of a gang: it deals the full random inputs into its layout shard, runs
forward and backward once (`timing.timed_pass`) under a ledger, and returns its shards of out, dq,
dk, dv. `evaluate` unshards them and holds them against `reference.reference` on the unsharded
inputs, and the ledger against the algorithm's analytic bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from seqpar import algorithms
from seqpar.algorithms import layouts
from seqpar.algorithms.base import DTYPES, Geometry
from seqpar.case import Case
from seqpar.workers.measure.reference import GRADS, TOLERANCE, error_scale, make_inputs, reference
from seqpar.workers.measure.timing import timed_pass

__all__ = ["GRADS", "TOLERANCE", "CheckResult", "RankResult", "evaluate", "failures_of",
           "mesh_key", "rank_run", "run_case", "run_cases"]


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


def rank_run(env, case: Case) -> RankResult:
    """On one rank of a gang (see platform.localgang): shard, run forward + backward, report."""
    dtype = DTYPES[case.dtype]
    cu, mask = case.cu_seqlens or None, case.attention_mask
    local = {name: layouts.shard(t, case.layout, env.rank, case.world, cu_seqlens=cu, mask=mask)
             .to(env.device, dtype) for name, t in make_inputs(case).items()}
    group = env.group(case.world)
    attn = algorithms.build_attention(case.algorithm, causal=case.causal, layout=case.layout,
                                      group=group, mesh=env.mesh, window=case.window, mask=mask,
                                      **dict(case.options))
    with algorithms.recording() as ledger:
        fwd_s, bwd_s, (out, q, k, v) = timed_pass(
            attn, [local[n] for n in ("q", "k", "v")], local["dout"],
            {"cu_seqlens": cu} if cu else {}, group, torch.device(env.device))
    shards = {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}
    return RankResult(
        shards={n: t.cpu() for n, t in shards.items()},
        bytes_sent={p: ledger.total(phase=p) for p in ("forward", "backward")},
        flops=dict(ledger.flops), ledger=ledger.to_dict(), seconds=fwd_s + bwd_s,
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


def evaluate(case: Case, results: list[RankResult]) -> CheckResult:
    """The ranks' shards against the float64 reference (relative errors, held to the dtype's
    tolerance) and every rank's bytes against the analytic count."""
    ref = reference(case)
    errors = {}
    mask = case.attention_mask
    for name in GRADS:
        got = layouts.unshard([r.shards[name] for r in results], case.layout,
                              cu_seqlens=case.cu_seqlens or None, mask=mask).double()
        errors[name] = float((got - ref[name]).abs().max()) / error_scale(ref[name])
    measured = {p: max(r.bytes_sent[p] for r in results) for p in ("forward", "backward")}
    geometry = Geometry.of(case.shape, case.world, case.layout, case.causal,
                           case.cu_seqlens or None, case.window, mask)  # net of skipped transfers
    expected = algorithms.expected_bytes(case.algorithm, case.shape, case.world,
                                         layout=case.layout, causal=case.causal,
                                         cu_seqlens=case.cu_seqlens or None, window=case.window,
                                         mask=mask, **dict(case.options))
    failures = [f"{n} error {e:.1e} > {TOLERANCE[case.dtype]:.0e}"
                for n, e in errors.items() if not e <= TOLERANCE[case.dtype]]
    spec = algorithms.get(case.algorithm)
    for r, res in enumerate(results):
        want = spec.bytes_of_rank(case.shape, case.world, dict(case.options), r, geometry)
        for p in ("forward", "backward"):
            if res.bytes_sent[p] != want[p]:
                failures.append(f"rank {r} {p} bytes {res.bytes_sent[p]} != {want[p]}")
    return CheckResult(case, errors, measured, expected,
                       [sum(r.flops.values()) for r in results],
                       max(r.seconds for r in results), failures)
