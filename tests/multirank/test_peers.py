"""The CPU peers run through seqpar's check harness: out, dq, dk and dv against float64 SDPA on the
unsharded inputs, and every rank's booked bytes against the peer's analytic count, exactly."""

from __future__ import annotations

import dataclasses

import pytest

from seqpar.case import Case
from seqpar.peers import catalogue
from seqpar.workers.measure.check import evaluate
from seqpar.workers.measure.check import run_case as run_on_gang

WHY = {p.name: p.unavailable for p in catalogue()}


def needs(name: str):
    return pytest.mark.skipif(WHY[name] is not None, reason=f"{name}: {WHY[name]}")


def case(name: str, world: int, layout: str, causal: bool, heads: int, kv_heads: int,
         dtype: str = "float64", **options) -> pytest.param:
    c = Case(name, world, layout, causal, heads=heads, kv_heads=kv_heads, seq_len=16 * world,
             dtype=dtype, options=tuple(sorted(options.items())))
    label = "-".join([f"P{world}", layout, "causal" if causal else "full", f"{heads}of{kv_heads}",
                      dtype, *(f"{v}" for v in options.values())])
    return pytest.param(c, id=label)


def check(gang, c: Case, seed: int) -> None:
    c = dataclasses.replace(c, seed=seed)
    result = evaluate(c, run_on_gang(gang, c))
    assert result.ok, f"{c.label()}: {result.failures}"
    assert all(result.bytes_measured[p] > 0 for p in ("forward", "backward"))


YUNCHANG = [case("peer:yunchang-ulysses", 2, "contiguous", True, 4, 4),
            case("peer:yunchang-ulysses", 2, "contiguous", True, 4, 2),
            case("peer:yunchang-ulysses", 4, "contiguous", True, 8, 4),
            case("peer:yunchang-ulysses", 2, "zigzag", False, 4, 2),
            case("peer:yunchang-ulysses", 2, "contiguous", True, 4, 2, dtype="float32")]

TORCH_CP = [case("peer:torch-cp-ring", world, layout, causal, heads, kv, rotate=rotate)
            for rotate in ("allgather", "alltoall")
            for world, layout, causal, heads, kv in ((2, "zigzag", True, 4, 4),
                                                     (4, "zigzag", True, 8, 2),
                                                     (2, "contiguous", True, 4, 2),
                                                     (2, "contiguous", False, 4, 4))]
TORCH_CP.append(case("peer:torch-cp-ring", 2, "zigzag", True, 4, 4, dtype="float32"))


@pytest.mark.multirank
@needs("peer:yunchang-ulysses")
@pytest.mark.parametrize("c", YUNCHANG)
def test_yunchang_ulysses_matches_float64_reference_and_its_bytes(gang, c, seed):
    check(gang, c, seed)


@pytest.mark.multirank
@needs("peer:torch-cp-ring")
@pytest.mark.parametrize("c", TORCH_CP)
def test_torch_cp_ring_matches_float64_reference_and_its_bytes(gang, c, seed):
    check(gang, c, seed)
