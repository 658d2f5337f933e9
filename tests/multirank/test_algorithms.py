"""Every algorithm x layout x mask x MHA/GQA x P against float64 SDPA on the unsharded inputs:
output and all three gradients, and the ledger against the analytic bytes, exactly. At P = 8
(8 ranks on 2 cores) `make test` runs a third of each algorithm's 12 cases, each (layout, mask,
heads) in one of allgather, ulysses and ring (`at_p8`); `make test-full` all of them."""

from __future__ import annotations

import dataclasses

import pytest

from seqpar.case import Case
from seqpar.workers.measure.check import evaluate
from seqpar.workers.measure.check import run_case as run_on_gang
from tests.resources import FULL

WORLDS = (1, 2, 3, 4, 8)
LAYOUTS = ("contiguous", "zigzag", "stripe")


def heads_for(world: int, gqa: bool) -> tuple[int, int]:
    """(heads, kv_heads): 8/2 replicates K,V for ulysses at P = 4 and 8; P = 3 needs heads % 3."""
    if world == 3:
        return (6, 3) if gqa else (6, 6)
    return (8, 2) if gqa else (8, 8)


def at_p8(algorithm: str, layout: str, causal: bool, gqa: bool) -> bool:
    """Whether make test runs this P = 8 case: combination c = (layout, mask, heads) of the 12 in
    algorithm c % 3 of allgather, ulysses and ring (each of them every layout and both masks)."""
    c = 4 * LAYOUTS.index(layout) + 2 * (not causal) + gqa
    return FULL or c % 3 == ("allgather", "ulysses", "ring").index(algorithm)


def cases(algorithm: str, worlds=WORLDS):
    out = []
    for world in worlds:
        for layout in LAYOUTS:
            for causal in (True, False):
                for gqa in (False, True):
                    heads, kv_heads = heads_for(world, gqa)
                    thin = world == 8 and not at_p8(algorithm, layout, causal, gqa)
                    out.append(pytest.param(
                        Case(algorithm, world, layout, causal, heads=heads,
                                  kv_heads=kv_heads),
                        id=f"P{world}-{layout}-{'causal' if causal else 'full'}-"
                           f"{'gqa' if gqa else 'mha'}",
                        marks=pytest.mark.slow if thin else ()))
    return out


def run_case(gang, case: Case, seed: int):
    case = dataclasses.replace(case, seed=seed)
    result = evaluate(case, run_on_gang(gang, case))
    assert result.ok, f"{case.label()}: {result.failures}"
    return result


@pytest.mark.multirank
@pytest.mark.parametrize("case", cases("local", worlds=(1,)))
def test_local_matches_reference(gang, case, seed):
    run_case(gang, case, seed)


@pytest.mark.multirank
@pytest.mark.parametrize("case", cases("allgather"))
def test_allgather_matches_reference(gang, case, seed):
    run_case(gang, case, seed)


@pytest.mark.multirank
@pytest.mark.parametrize("case", cases("ulysses"))
def test_ulysses_matches_reference(gang, case, seed):
    run_case(gang, case, seed)


@pytest.mark.multirank
@pytest.mark.parametrize("case", cases("ring"))
def test_ring_matches_reference(gang, case, seed):
    run_case(gang, case, seed)


@pytest.mark.multirank
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("algorithm", ["allgather", "ulysses", "ring"])
@pytest.mark.parametrize("world", [2, 4])
def test_low_precision_within_tolerance(gang, algorithm, world, dtype, seed):
    run_case(gang, Case(algorithm, world, "zigzag", True, heads=8, kv_heads=2, dtype=dtype,
                             seq_len=64), seed)


@pytest.mark.multirank
@pytest.mark.parametrize("algorithm", ["allgather", "ulysses", "ring"])
def test_ledger_bytes_equal_analytic_count(gang, algorithm, seed):
    result = run_case(gang, Case(algorithm, 4, "zigzag", True, heads=8, kv_heads=2), seed)
    assert result.bytes_measured == result.bytes_expected
    assert result.bytes_measured["forward"] > 0 and result.bytes_measured["backward"] > 0


@pytest.mark.multirank
@pytest.mark.parametrize("layout", ["zigzag", "stripe"])
def test_causal_work_is_balanced_in_zigzag_and_stripe(gang, layout, seed):
    result = run_case(gang, Case("ring", 4, layout, True), seed)
    assert len(set(result.flops_per_rank)) == 1, result.flops_per_rank


@pytest.mark.multirank
def test_contiguous_causal_work_is_imbalanced_by_2p_minus_1(gang, seed):
    result = run_case(gang, Case("ring", 4, "contiguous", True), seed)
    flops = result.flops_per_rank
    assert flops == sorted(flops)
    assert max(flops) / min(flops) == pytest.approx(2 * 4 - 1)
