"""Packed documents (cu_seqlens) and sliding windows, exact in float64 for every algorithm and layout
against SDPA with an explicit boolean mask on the unsharded sequence
(workers/measure/reference.reference_mask): output and all three gradients, and every rank's ledger
bytes against the analytic count.

One gang round-trip per (algorithm, options, P) runs the whole batch. `make test` runs a covering
design of a twelfth of the full product layout x {causal, full} x {MHA, GQA} x relation (13 of 156
cases) at one P per algorithm (`DOCUMENTS_AT`: P = 3 for allgather, ulysses and ring, P = 4 for
burst and the two-level algorithms): each algorithm every relation once, every layout, both masks
and both head counts; over the seven algorithms (consecutive design seeds, `design_seed`) every
relation with every layout, with each mask x heads combination, and in each kind of relation
(documents, windows, uneven lengths) every layout x {causal, full}. The any-mask
matrix (tests/multirank/test_masks.py) runs documents and windows at P = 2 and 4. The design is
fixed (the same cases on every run, so a broken combination fails every time; the inputs still
change with the seed). Plain calls of any length run each algorithm at one P of 2, 3 and 4
(`PLAIN_AT`), 9 of their 27 cases. `SEQPAR_TEST_FULL=1` (`make test-full`) runs the full
product at every P, 8 included."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from seqpar.case import Case
from seqpar.workers.measure.check import failures_of
from tests.resources import FULL

ALGORITHMS = {  # name -> options per world
    "allgather": lambda p: (),
    "ulysses": lambda p: (),
    "ring": lambda p: (),
    "usp": lambda p: (("dhp", 2),) if p % 2 == 0 else (("dhp", p),),
    "double_ring": lambda p: (("inner_ring", 2),) if p % 2 == 0 else (),
    "wallfacer": lambda p: (("team_size", 2),) if p >= 4 else (("team_size", 1),),
    "burst": lambda p: (),
}
LAYOUTS = ("contiguous", "zigzag", "stripe")
TWO_LEVEL = ("usp", "double_ring", "wallfacer")  # their options do their two-level thing at P = 4
# make test: each algorithm at one P (the rest in make test-full); the two-level ones at P = 4
DOCUMENTS_AT = {a: 4 if a in TWO_LEVEL or a == "burst" else 3 for a in ALGORITHMS}
PLAIN_AT = {**{a: 4 for a in TWO_LEVEL}, "allgather": 2, "ulysses": 3, "ring": 3, "burst": 2}


def at(worlds: list[int], covered: dict[str, int]) -> list:
    """(algorithm, P) parameters: `covered`'s P in make test, every other one marked slow."""
    return [pytest.param(a, w, id=f"{a}-{w}",
                         marks=() if covered[a] == w else pytest.mark.slow)
            for a in ALGORITHMS for w in worlds]

Relation = tuple[int, tuple[int, ...], int | None]  # (N, cu_seqlens, window)


def documents(n: int, world: int, units: tuple[int, ...]) -> tuple[int, ...]:
    """Documents of `units` x 2P tokens each (zigzag deals each document in 2P chunks)."""
    cu = [0]
    for u in units:
        cu.append(cu[-1] + u * 2 * world)
    assert cu[-1] == n
    return tuple(cu)


def relations(n: int, world: int) -> dict[str, list[Relation]]:
    """(N, cu_seqlens, window) by kind: documents (2 and 5 of unequal lengths, documents of any
    length: 1 token, odd; with and without a window), windows 1, 7, N/2 (alone and with
    documents), and lengths N-1 and N+3 that do not divide into 2P (uneven shards: one document
    [0, N], or four, with and without a window)."""
    u = n // (2 * world)
    docs2 = documents(n, world, (u // 3, u - u // 3))
    docs5 = documents(n, world, (1, 2, 1, u - 5, 1))
    odd = (0, 5, 6, n - 3, n)
    m = n - 1
    return {
        "documents": [(n, docs2, None), (n, docs5, None), (n, odd, None), (n, docs5, 7)],
        "windows": [(n, (), 1), (n, (), 7), (n, (), n // 2), (n, docs2, n // 2), (n, odd, 3)],
        "uneven": [(m, (0, m), None), (n + 3, (0, n + 3), 7), (m, (0, 1, 7, m - 2, m), None),
                   (m, (0, 1, 7, m - 2, m), n // 2)],
    }


KINDS = (("documents", 4), ("windows", 5), ("uneven", 4))  # (kind, its relations)


def covering(seed: int) -> list[tuple[str, int, int, bool, int]]:
    """(kind, relation index, layout index, causal, heads index) of the sampled design (13 of the
    156 cases): each relation once, relation r (0-12 over the kinds) in layout (r + seed) % 3 with
    mask x heads combination (r + seed) % 4 — every layout, both masks and both head counts in
    each design; over 3 and 4 consecutive seeds every relation meets every layout and every
    combination."""
    rows, r = [], 0
    for kind, count in KINDS:
        for j in range(count):
            combo = (r + seed) % 4
            rows.append((kind, j, (r + seed) % len(LAYOUTS), combo % 2 == 0, combo // 2))
            r += 1
    return rows


def design_seed(algorithm: str, world: int) -> int:
    """make test's design of `algorithm` at P: the algorithms' designs are consecutive seeds."""
    return world + list(ALGORITHMS).index(algorithm)


def batch(algorithm: str, world: int, seed: int) -> list[Case]:
    n = 2 * world * (10 if world <= 4 else 8)
    heads = {3: ((6, 6), (6, 3)), 8: ((8, 8), (8, 2))}.get(world, ((4, 4), (4, 2)))
    by_kind = relations(n, world)
    if not FULL:
        rows = covering(design_seed(algorithm, world))  # fixed per (algorithm, P)
    else:
        rows = [(kind, j, layout, causal, h)
                for layout, causal, h in itertools.product(range(len(LAYOUTS)), (True, False),
                                                           range(len(heads)))
                for kind, rels in by_kind.items() for j in range(len(rels))]
    out = []
    for kind, j, layout, causal, h in rows:
        length, cu, window = by_kind[kind][j]
        out.append(Case(algorithm, world, LAYOUTS[layout], causal, batch=1, seq_len=length,
                        heads=heads[h][0], kv_heads=heads[h][1], head_dim=4, seed=seed,
                        cu_seqlens=cu, window=window, options=ALGORITHMS[algorithm](world)))
    return out


def test_the_sampled_design_covers_what_the_full_product_does():
    """Each design: every relation once, every layout, both masks, both head counts; make test's
    designs together: every relation x layout, x mask, x heads, every kind x layout x mask."""
    relations_ = {(k, j) for k, n in KINDS for j in range(n)}
    for seed in range(12):
        rows = covering(seed)
        assert len(rows) == 13 and {(k, j) for k, j, *_ in rows} == relations_
        assert {lay for _, _, lay, _, _ in rows} == set(range(3))
        assert {(c, h) for *_, c, h in rows} == set(itertools.product((True, False), (0, 1)))
    rows = [row for a in ALGORITHMS for row in covering(design_seed(a, DOCUMENTS_AT[a]))]
    assert {(k, j, lay) for k, j, lay, _, _ in rows} == {
        (k, j, lay) for k, j in relations_ for lay in range(3)}
    assert {(k, j, c, h) for k, j, _, c, h in rows} == {
        (k, j, c, h) for k, j in relations_ for c in (True, False) for h in (0, 1)}
    assert {(k, lay, c) for k, _, lay, c, _ in rows} == set(itertools.product(
        ("documents", "windows", "uneven"), range(3), (True, False)))
    cases = batch("ring", 8, seed=5)
    other = batch("ring", 8, seed=6)  # another run: other inputs, the same combinations
    assert [dataclasses.replace(c, seed=0) for c in cases] == \
        [dataclasses.replace(c, seed=0) for c in other]
    assert {c.window for c in cases} == {None, 1, 3, 7, 64}
    assert {len(c.cu_seqlens) - 1 for c in cases} >= {1, 2, 4, 5}
    assert any(c.seq_len % 16 for c in cases)


@pytest.mark.multirank
@pytest.mark.parametrize(("algorithm", "world"), at([2, 3, 4, 8], DOCUMENTS_AT))
def test_documents_and_windows_are_exact(gang, algorithm, world, seed):
    cases = batch(algorithm, world, seed)
    failures = failures_of(gang, cases)
    assert not failures, "\n".join(failures[:10])


def plain(algorithm: str, world: int, seed: int) -> list[Case]:
    """Cases given no documents, of lengths that do not divide into zigzag's 2P chunks: N = 7P (a
    plain call: every rank holds N/P tokens) and N = 7P + 1 (uneven shards, which the case hands
    the attention as one document [0, N]), odd at every P: every layout x {causal, full} x {MHA,
    GQA} (make test: each length x layout once, the four mask x heads combinations by turns),
    and each layout with a window."""
    heads = ((6, 6), (6, 3)) if world == 3 else ((4, 4), (4, 2))
    n = 7 * world
    cases = [(length, layout, causal, h, None) for length, layout, causal, h in itertools.product(
        (n, n + 1), LAYOUTS, (True, False), heads)]
    if not FULL:  # make test: each (length, layout) once, mask x heads by turns (all four met)
        a = list(ALGORITHMS).index(algorithm)
        cases = [(length, layout, causal, h, None) for length, layout, causal, h, _ in cases
                 if (LAYOUTS.index(layout) + 2 * (length - n) + a) % 4
                 == 2 * heads.index(h) + (not causal)]
    cases += [(n, layout, True, heads[1], 5) for layout in LAYOUTS]
    return [Case(algorithm, world, layout, causal, batch=1, seq_len=length, heads=h, kv_heads=hkv,
                 head_dim=4, seed=seed, window=window, options=ALGORITHMS[algorithm](world))
            for length, layout, causal, (h, hkv), window in cases]


@pytest.mark.multirank
@pytest.mark.parametrize(("algorithm", "world"), at([2, 3, 4], PLAIN_AT))
def test_plain_calls_of_any_length_per_rank_are_exact(gang, algorithm, world, seed):
    cases = plain(algorithm, world, seed)
    assert all(c.seq_len % (2 * world) for c in cases)
    assert {c.cu_seqlens for c in cases if c.seq_len % world == 0} == {()}  # plain calls
    failures = failures_of(gang, cases)
    assert not failures, "\n".join(failures[:10])
