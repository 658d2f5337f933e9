"""Transfer skipping (option skip_transfers, rules/route.py): with windows and documents the ring
schedules carry only the blocks some query ahead sees, and stay exact in float64 against SDPA with an
explicit mask (workers/measure/reference.reference_mask); every rank's ledger sends exactly the
analytic count under the call's mask (`bytes_of_rank(..., mask)`) and books the rest as skipped
(`skipped_of_rank`), the two adding up to the unskipped count; and skipping removes the bytes it
must (a contiguous ring with a window that reaches one neighbour ends after 2 steps).

`make test` runs a covering quarter of (layout, causal, heads, relation) at P = 2 and 4 (each P its
own quarter; P = 4 runs every two-level form: usp dhp=2, double_ring inner_ring=2, wallfacer
team_size=2); `make test-full` the full product at P = 2, 4 and 8."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from seqpar import algorithms
from seqpar.algorithms import Mask
from seqpar.case import Case
from seqpar.rules import route
from seqpar.workers.measure.check import TOLERANCE, evaluate, run_cases
from tests.resources import FULL

SKIP = (("skip_transfers", True),)
ALGORITHMS = {  # name -> options per world (besides skip_transfers)
    "ring": lambda p: (),
    "burst": lambda p: (),
    "usp": lambda p: (("dhp", 2),) if p >= 4 else (),
    "double_ring": lambda p: (("inner_ring", 2),) if p >= 4 else (),
    "wallfacer": lambda p: (("team_size", 2),) if p >= 4 else (("team_size", 1),),
}


def relations(n: int, world: int) -> list[tuple[tuple[int, ...], int | None]]:
    """(cu_seqlens, window): windows 1, 7 and N/8; 2 and 5 documents of unequal lengths (zigzag
    deals each in 2P chunks); documents with a window; an odd split."""
    u = n // (2 * world)
    docs2 = (0, 2 * world * (u // 3), n)
    docs5 = tuple(itertools.accumulate((0, 2 * world, 4 * world, 2 * world,
                                        2 * world * (u - 5), 2 * world)))
    return [((), 1), ((), 7), ((), n // 8), (docs2, None), (docs5, None), (docs5, 7),
            ((0, 5, 6, n - 3, n), 3)]


HEADS = ((4, 4), (4, 2))


def design(world: int) -> list[tuple[str, bool, int, int]]:
    """(layout, causal, heads index, relation index): the full product under SEQPAR_TEST_FULL, else
    a covering quarter (every relation with both layouts, and over the relations both masks and
    both head counts with each layout; each P its own quarter)."""
    rows = []
    for (li, layout), causal, h, j in itertools.product(enumerate(("contiguous", "zigzag")),
                                                        (True, False), range(len(HEADS)),
                                                        range(7)):
        combo = (j + li + world) % 4
        if FULL or (causal, h) == (combo % 2 == 0, combo // 2):
            rows.append((layout, causal, h, j))
    return rows


def batch(algorithm: str, world: int, seed: int) -> list[Case]:
    n = 2 * world * 8
    options = tuple(sorted(SKIP + ALGORITHMS[algorithm](world)))
    rels = relations(n, world)
    out = []
    for layout, causal, h, j in design(world):
        (heads, kv_heads), (cu, window) = HEADS[h], rels[j]
        out.append(Case(algorithm, world, layout, causal, batch=1, seq_len=n, heads=heads,
                        kv_heads=kv_heads, head_dim=4, seed=seed, cu_seqlens=cu, window=window,
                        options=options))
    return out


def mask_of(case: Case) -> Mask:
    return Mask.of(case.shape, case.world, case.layout, case.causal, case.cu_seqlens or None,
                   case.window)


def skipped_of(result) -> dict[str, int]:
    return {p: sum(e["bytes_sent"] for e in result.ledger["skipped"] if e["phase"] == p)
            for p in ("forward", "backward")}


def problems(case: Case, results) -> list[str]:
    """Exactness of out, dq, dk, dv, and every rank's sent and skipped bytes against the counts
    under the case's mask (evaluate's own byte check knows no mask: its bytes lines are not ours)."""
    errors = evaluate(case, results).errors
    out = [f"{n} error {e:.1e}" for n, e in errors.items() if not e <= TOLERANCE[case.dtype]]
    spec, opts, mask = algorithms.get(case.algorithm), dict(case.options), mask_of(case)
    for r, res in enumerate(results):
        sent = spec.bytes_of_rank(case.shape, case.world, opts, r, mask)
        skipped = spec.skipped_of_rank(case.shape, case.world, opts, r, mask)
        full = spec.bytes_of_rank(case.shape, case.world, opts, r)
        got = skipped_of(res)
        for p in ("forward", "backward"):
            if res.bytes_sent[p] != sent[p]:
                out.append(f"rank {r} {p} sent {res.bytes_sent[p]} != {sent[p]}")
            if got[p] != skipped[p]:
                out.append(f"rank {r} {p} skipped {got[p]} != {skipped[p]}")
            if sent[p] + skipped[p] != full[p]:
                out.append(f"rank {r} {p} sent + skipped {sent[p] + skipped[p]} != {full[p]}")
    return out


def failures(gang, cases: list[Case]) -> list[str]:
    out = []
    for case, results in zip(cases, run_cases(gang, cases), strict=True):
        found = problems(case, results)
        if found:
            out.append(f"{case.label()} cu={case.cu_seqlens}: {found[:4]}")
    return out


def test_the_design_covers_every_relation_layout_mask_and_head_count():
    for world in (2, 4, 8):
        rows = design(world)
        assert len(rows) == (56 if FULL else 14)
        assert {(lay, j) for lay, _, _, j in rows} == set(itertools.product(
            ("contiguous", "zigzag"), range(7)))
        assert {(lay, c, h) for lay, c, h, _ in rows} == set(itertools.product(
            ("contiguous", "zigzag"), (True, False), (0, 1)))


@pytest.mark.multirank
@pytest.mark.parametrize("world", [2, 4, pytest.param(8, marks=pytest.mark.slow)])
@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_skipping_is_exact_and_counted(gang, algorithm, world, seed):
    cases = batch(algorithm, world, seed)
    found = failures(gang, cases)
    assert not found, "\n".join(found[:10])


@pytest.mark.multirank
def test_contiguous_window_ring_ends_after_two_steps(gang, seed):
    """Contiguous, P = 4, window of s/2: rank r sees only blocks r - 1 and r. Every block travels
    one hop (block 3 none: rank 0 sees nothing before it), the dK,dV come home after one step, and
    the ring ends after 2 of its 4 steps; ranks 0-2 send one K,V message of the 3, rank 3 none,
    and 1, 2, 2, 1 of the 4 gradient messages (rank 0 holds nothing at step 1, rank 3's own
    block never leaves)."""
    world, n = 4, 64
    case = Case("ring", world, "contiguous", True, batch=1, seq_len=n, heads=2, kv_heads=2,
                head_dim=4, seed=seed, window=n // 8, options=SKIP)
    need = mask_of(case).need(world)
    assert all(route.plan(world, world, r, need).steps == 2 for r in range(world))
    kv = 2 * 2 * (n // world) * 4 * 8  # K and V, 2 heads, s rows, D = 4, float64
    results = run_cases(gang, [case, dataclasses.replace(case, options=(('skip_transfers', False),))])
    skip, full = results
    for r in range(world):
        kv_msgs = 0 if r == world - 1 else 1
        grad_msgs = 1 if r in (0, world - 1) else 2
        assert skip[r].bytes_sent == {"forward": kv_msgs * kv,
                                      "backward": (kv_msgs + grad_msgs) * kv}
        assert full[r].bytes_sent == {"forward": 3 * kv, "backward": 7 * kv}
        assert skipped_of(skip[r]) == {"forward": (3 - kv_msgs) * kv,
                                       "backward": (3 - kv_msgs + 4 - grad_msgs) * kv}
        assert skipped_of(full[r]) == {"forward": 0, "backward": 0}
    assert not problems(case, skip)
    assert algorithms.skipped_bytes("ring", case.shape, world, layout="contiguous",
                                    window=n // 8, skip_transfers=True) == {
        "forward": 2 * kv, "backward": 4 * kv}
