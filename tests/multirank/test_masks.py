"""Any mask, exact in float64 for every algorithm and layout against SDPA under the mask's dense rows
(workers/measure/reference.py): output and all three gradients, and every rank's ledger bytes
against `expected_bytes(mask=)` net of the transfers the rings skip.

The mask kinds: the eight constructors (causal, documents, causal and bidirectional windows,
block-sparse, dilated, prefix-LM, shared question, from_dense with rows that see nothing) and random
slice lists of all four slice kinds. `make test` runs a covering design: each algorithm every mask
kind once and every layout, every (mask kind, layout) in some algorithm, spread over P = 2 and
4 (P = 4 alone for the two-level algorithms) and over MHA and GQA, with uneven lengths among
them; P = 8 costs 3-4 times P = 4 on 2 cores and runs the same code (test_algorithms.py and
test_usp.py keep P = 8 in make test). `SEQPAR_TEST_FULL=1` (`make test-full`) runs the full
product at every P, 8 included, with both head counts."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from seqpar.case import Case
from seqpar.rules import masks
from seqpar.workers.measure.check import failures_of
from tests.resources import FULL

ALGORITHMS = {  # name -> options per world
    "allgather": lambda p: (),
    "ulysses": lambda p: (),
    "ring": lambda p: (),
    "usp": lambda p: (("dhp", 2),),
    "double_ring": lambda p: (("inner_ring", 2),),
    "wallfacer": lambda p: (("team_size", 2),) if p >= 4 else (("team_size", 1),),
    "burst": lambda p: (),
}
LAYOUTS = ("contiguous", "zigzag", "stripe", "balanced")
WORLDS = (2, 4, 8)
TWO_LEVEL = ("usp", "double_ring", "wallfacer")  # their options do nothing at P = 2


def covered(algorithm: str) -> tuple[int, ...]:
    """make test's worlds for `algorithm`: P = 2 and 4, or 4 alone where P = 2 would run the
    two-level algorithms as one level; P = 8 in make test-full."""
    return (4,) if algorithm in TWO_LEVEL else (2, 4)


def random_slices(n: int, rng: np.random.Generator) -> str:
    """Row bands, each with one to three disjoint key ranges of random kinds."""
    cuts = sorted({0, n, *rng.integers(1, n, 3).tolist()})
    out = []
    for q0, q1 in zip(cuts, cuts[1:], strict=False):
        edges = sorted(set(rng.integers(0, n + 1, 2 * int(rng.integers(1, 4))).tolist()))
        for k0, k1 in zip(edges[::2], edges[1::2], strict=False):
            if k1 > k0:
                kind = str(rng.choice(masks.KINDS))
                s = masks.Slice(q0, q1, k0, k1, kind)
                out.append(s if s.area > 0 else s._replace(kind="full"))
    return masks.as_spec(masks.from_slices(n, out))


def dense(n: int, rng: np.random.Generator) -> str:
    """A union of random rectangles and triangles, two rows that see no key (their output and
    gradients must be 0)."""
    d = np.zeros((n, n), dtype=bool)
    t = np.arange(n)
    for _ in range(4):
        q0, q1 = sorted(rng.integers(0, n + 1, 2))
        k0, k1 = sorted(rng.integers(0, n + 1, 2))
        block = (t[:, None] >= q0) & (t[:, None] < q1) & (t[None, :] >= k0) & (t[None, :] < k1)
        d |= block & (t[None, :] <= t[:, None]) if rng.random() < 0.5 else block
    d[rng.integers(0, n, 2)] = False
    d[0, 0] = True
    return masks.as_spec(masks.from_dense(d))


def mask_kinds(n: int, seed: int) -> dict[str, str]:
    """A spec of each kind for n tokens (n a multiple of 8 for the block kinds)."""
    rng = np.random.default_rng(seed)
    b = 8 if n % 8 == 0 else 2
    return {
        "causal": "causal",
        "documents": f"documents:{n // 3},{n - n // 3}:window=5",
        "window": f"window:{max(2, n // 6)}",
        "window-full": f"window:{n // 5}:full",
        "block_sparse": f"block_sparse:{b}:0.35:{seed}",
        "dilated": f"dilated:{b}:3",
        "prefix_lm": f"prefix_lm:{n // 3}",
        "shared_question": f"shared_question:{n // 4}:{n // 4},{n // 4},{n - 3 * (n // 4)}",
        "dense": dense(n, rng),
        "slices": random_slices(n, rng),
    }


KINDS = list(mask_kinds(64, 0))


def heads(world: int, gqa: bool) -> tuple[int, int]:
    h = 8 if world == 8 else 4
    return (h, 2) if gqa else (h, h)


def design(algorithm: str, world: int) -> list[tuple[str, int, bool, int]]:
    """(mask kind, layout index, gqa, n) of the cases one gang round-trip runs: the full product
    under SEQPAR_TEST_FULL, else each kind once in layout (kind + algorithm) % 4 (every layout
    met by each algorithm, every (kind, layout) by some algorithm), at the P of `covered` that
    (kind + algorithm) picks, MHA or GQA alternating, an uneven length for every third case."""
    a = list(ALGORITHMS).index(algorithm)
    rows = []
    for k, lay in itertools.product(range(len(KINDS)), range(len(LAYOUTS))):
        n = 16 * world - (2 if (k + lay) % 3 == 0 and KINDS[k] not in ("block_sparse",
                                                                          "dilated") else 0)
        if FULL:
            rows += [(KINDS[k], lay, gqa, n) for gqa in (False, True)]
        elif (lay == (k + a) % len(LAYOUTS) and world in (ps := covered(algorithm))
              and (k + a) % len(ps) == ps.index(world)):
            rows.append((KINDS[k], lay, (k + lay) // 2 % 2 == 1, n))
    return rows


def batch(algorithm: str, world: int, seed: int) -> list[Case]:
    out = []
    for kind, lay, gqa, n in design(algorithm, world):
        h, hkv = heads(world, gqa)
        out.append(Case(algorithm, world, LAYOUTS[lay], True, batch=1, seq_len=n, heads=h,
                        kv_heads=hkv, head_dim=4, seed=seed, mask=mask_kinds(n, seed)[kind],
                        options=ALGORITHMS[algorithm](world)))
    return out


def test_the_design_covers_every_algorithm_layout_and_mask_kind_once():
    met = set()
    for algorithm in ALGORITHMS:
        rows = [(k, lay) for w in WORLDS for k, lay, _, _ in design(algorithm, w)]
        met |= set(rows)
        if not FULL:
            assert sorted(k for k, _ in rows) == sorted(KINDS)  # each kind once
            assert {lay for _, lay in rows} == set(range(len(LAYOUTS)))
            assert {w for w in covered(algorithm) if design(algorithm, w)} == set(covered(algorithm))
        gqa = {g for w in WORLDS for _, _, g, _ in design(algorithm, w)}
        assert gqa == {True, False}
        assert any(n % (2 * w) for w in WORLDS for *_, n in design(algorithm, w))
    assert met == set(itertools.product(KINDS, range(len(LAYOUTS))))  # every (kind, layout)


@pytest.mark.multirank
@pytest.mark.parametrize(("algorithm", "world"), [
    pytest.param(a, w, marks=() if w in covered(a) else pytest.mark.slow, id=f"{a}-{w}")
    for a in ALGORITHMS for w in WORLDS])
def test_every_mask_is_exact_forward_and_backward(gang, algorithm, world, seed):
    cases = batch(algorithm, world, seed)
    for c in cases:
        c.validate()
    failures = failures_of(gang, cases)
    assert not failures, "\n".join(failures[:10])


@pytest.mark.multirank
def test_local_is_exact_under_every_mask_kind(gang, seed):
    cases = [Case("local", 1, "contiguous", True, batch=1, seq_len=40, heads=4, kv_heads=2,
                  head_dim=4, seed=seed, mask=spec) for spec in mask_kinds(40, seed).values()]
    failures = failures_of(gang, cases)
    assert not failures, "\n".join(failures[:10])
