"""Packed documents (cu_seqlens) and sliding windows, exact in float64 for every algorithm and layout
against SDPA with an explicit boolean mask on the unsharded sequence (workers/check.reference_mask):
output and all three gradients, and every rank's ledger bytes against the analytic count.

One gang round-trip per (algorithm, options, P) runs the whole batch of layouts x masks x relations."""

from __future__ import annotations

import itertools

import pytest

from seqpar.case import Case
from seqpar.workers.check import failures_of

ALGORITHMS = {  # name -> options per world
    "allgather": lambda p: (),
    "ulysses": lambda p: (),
    "ring": lambda p: (),
    "usp": lambda p: (("dhp", 2),) if p % 2 == 0 else (("dhp", p),),
    "double_ring": lambda p: (("inner_ring", 2),) if p % 2 == 0 else (),
    "wallfacer": lambda p: (("team_size", 2),) if p >= 4 else (("team_size", 1),),
    "burst": lambda p: (),
}


def documents(n: int, world: int, units: tuple[int, ...]) -> tuple[int, ...]:
    """Documents of `units` x 2P tokens each (zigzag deals each document in 2P chunks)."""
    cu = [0]
    for u in units:
        cu.append(cu[-1] + u * 2 * world)
    assert cu[-1] == n
    return tuple(cu)


def relations(n: int, world: int) -> list[tuple[int, tuple[int, ...], int | None]]:
    """(N, cu_seqlens, window): 2 and 5 documents of unequal lengths; windows 1, 7, N/2 alone and
    with documents; documents of any length (1 token, odd); lengths N-1 and N+3 that do not
    divide into 2P (uneven shards: one document [0, N], or four, with and without a window)."""
    u = n // (2 * world)
    docs2 = documents(n, world, (u // 3, u - u // 3))
    docs5 = documents(n, world, (1, 2, 1, u - 5, 1))
    odd = (0, 5, 6, n - 3, n)
    m = n - 1
    return [(n, docs2, None), (n, docs5, None), (n, (), 1), (n, (), 7), (n, (), n // 2),
            (n, docs5, 7), (n, docs2, n // 2), (n, odd, None), (n, odd, 3),
            (m, (0, m), None), (n + 3, (0, n + 3), 7), (m, (0, 1, 7, m - 2, m), None),
            (m, (0, 1, 7, m - 2, m), n // 2)]


def batch(algorithm: str, world: int, seed: int) -> list[Case]:
    n = 2 * world * (10 if world <= 4 else 8)
    heads = {3: ((6, 6), (6, 3)), 8: ((8, 8), (8, 2))}.get(world, ((4, 4), (4, 2)))
    out = []
    for layout, causal, (h, hkv) in itertools.product(
            ("contiguous", "zigzag", "stripe"), (True, False), heads):
        for length, cu, window in relations(n, world):
            out.append(Case(algorithm, world, layout, causal, batch=1, seq_len=length, heads=h,
                            kv_heads=hkv, head_dim=4, seed=seed, cu_seqlens=cu, window=window,
                            options=ALGORITHMS[algorithm](world)))
    return out


@pytest.mark.multirank
@pytest.mark.parametrize("world", [2, 3, 4, 8])
@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_documents_and_windows_are_exact(gang, algorithm, world, seed):
    cases = batch(algorithm, world, seed)
    failures = failures_of(gang, cases)
    assert not failures, "\n".join(failures[:10])
