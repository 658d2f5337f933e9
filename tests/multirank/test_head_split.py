"""Ulysses with kv_heads neither a multiple nor a divisor of P (H=6, Hkv=2 at P=3; H=12, Hkv=6 at
P=4, where a rank's query heads read K,V heads unevenly): exact in float64, also on uneven (padded)
shards, with documents and a window, and every rank's bytes equal to the analytic count (each rank
receives exactly the K,V heads its query heads need)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from seqpar.algorithms.ulysses import kv_ranges
from seqpar.case import Case
from seqpar.workers.measure.check import failures_of


def test_kv_ranges_give_each_member_exactly_the_heads_its_queries_read():
    assert kv_ranges(6, 2, 3) == [(0, 1), (0, 2), (1, 2)]
    assert kv_ranges(12, 6, 4) == [(0, 2), (1, 3), (3, 5), (4, 6)]
    assert kv_ranges(8, 2, 4) is None and kv_ranges(8, 8, 4) is None


@pytest.mark.multirank
@pytest.mark.parametrize("world,heads,kv_heads", [(3, 6, 2), (4, 12, 6)])
def test_ulysses_uneven_kv_heads_are_exact_with_exact_bytes(gang, world, heads, kv_heads, seed):
    cases = [Case("ulysses", world, layout, causal, batch=1, seq_len=n, heads=heads,
                  kv_heads=kv_heads, head_dim=4, seed=seed, cu_seqlens=cu, window=window)
             for n in (8 * world, 8 * world + 1)  # N + 1: uneven shards, padded
             for layout, causal, (cu, window) in itertools.product(
                 ("contiguous", "zigzag", "stripe"), (True, False),
                 (((), None), ((0, n), None), ((0, 2 * world, n), None), ((0, 5, n), 7)))
             if (cu or n % world == 0) and (window is None or causal)]
    failures = failures_of(gang, cases)
    assert not failures, "\n".join(failures[:10])


@pytest.mark.multirank
@pytest.mark.parametrize("world,heads,kv_heads,dhp", [
    (4, 6, 3, 2),  # make test: P = 8's two grids (dhp = 4 and 2) are the same split, twice the cost
    pytest.param(8, 12, 6, 4, marks=pytest.mark.slow), pytest.param(8, 6, 3, 2, marks=pytest.mark.slow)])
def test_usp_uneven_kv_heads_are_exact_with_exact_bytes(gang, world, heads, kv_heads, dhp, seed):
    """usp whose kv_heads neither split nor replicate over dhp: each HP member receives its
    query heads' K,V heads, the context ring carries that range, gradients go back summed."""
    n = 8 * world
    dcp = world // dhp
    grids = [{"dhp": dhp, "placement": p, "inner_ring": w}
             for p in ("head-first", "context-first") for w in sorted({1, dcp})]
    failures = []
    for o in grids:  # one mesh per grid
        cases = [Case("usp", world, layout, causal, batch=1, seq_len=n, heads=heads,
                      kv_heads=kv_heads, head_dim=4, seed=seed,
                      options=tuple(sorted(o.items())), cu_seqlens=cu)
                 for layout in ("contiguous", "zigzag", "stripe")
                 for causal in (True, False) for cu in ((), (0, 3, n + 1))]
        failures += failures_of(gang, [dataclasses.replace(c, seq_len=c.cu_seqlens[-1])
                                       if c.cu_seqlens else c for c in cases])
    assert not failures, "\n".join(failures[:10])
