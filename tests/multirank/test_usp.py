"""usp (LoongTrain 2D-Attention) and double_ring on real gloo groups: exact against float64 SDPA for
every grid of P = 4 and 8, both placements, every inner ring (`make test`: every grid of P = 4 and
one inner ring a (dhp, placement) of P = 8; `make test-full` every grid); the ledger against §4.5's
counts; the placements' intra/inter-node split on 2 nodes x 4; dhp = 1 is ring and dcp = 1 is
ulysses."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from seqpar import algorithms
from seqpar.algorithms import AttnShape, usp
from seqpar.case import Case
from seqpar.errors import SeqparError
from seqpar.rules.groups import PLACEMENTS
from seqpar.workers.measure.check import evaluate, mesh_key, rank_run
from tests.resources import FULL

NODES = (0, 0, 0, 0, 1, 1, 1, 1)  # 2 nodes x 4 ranks
LAYOUTS = ("contiguous", "zigzag", "stripe")


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def grids():
    """Every (P, dhp, placement, inner ring) of P = 4 and 8; one placement where both coincide.
    `make test` runs every grid of P = 4 and, at P = 8, each (dhp, placement) with one inner ring
    (`P8_INNER`: every inner ring 1, 2, 4, 8 met once or more); the other P = 8 grids are make
    test-full's."""
    out = []
    for world in (4, 8):
        for dhp in divisors(world):
            dcp = world // dhp
            for placement in PLACEMENTS if 1 < dhp < world else PLACEMENTS[:1]:
                for inner in divisors(dcp):
                    thin = world == 8 and P8_INNER[dhp, placement] != inner
                    out.append(pytest.param(world, dhp, placement, inner,
                                            id=f"P{world}-hp{dhp}-cp{dcp}-{placement}-w{inner}",
                                            marks=pytest.mark.slow if thin else ()))
    return out


# make test's P = 8 grids: (dhp, placement) -> its one inner ring (the 14 grids: make test-full)
P8_INNER = {(1, "head-first"): 8, (2, "head-first"): 4, (2, "context-first"): 2,
            (4, "head-first"): 1, (4, "context-first"): 2, (8, "head-first"): 1}


def _batch(env, cases):
    return [rank_run(env, case) for case in cases]


@pytest.mark.multirank
@pytest.mark.parametrize(("world", "dhp", "placement", "inner"), grids())
def test_usp_matches_reference_for_every_grid(gang, world, dhp, placement, inner, seed):
    """Causal in all three layouts and full attention, MHA (8/8) and GQA (8/2: dhp = 4 and 8
    replicate K,V); output, dq, dk, dv within 1e-10 and every rank's bytes equal to the count.
    At P = 8 `make test` runs each layout/mask with one head count per grid (the other in the
    next grid); SEQPAR_TEST_FULL both."""
    if dhp == 1:  # the context-parallel-only case is the double_ring entry
        algorithm, options = "double_ring", (("inner_ring", inner),)
    else:
        algorithm = "usp"
        options = (("dhp", dhp), ("inner_ring", inner), ("placement", placement))
    full_layout = LAYOUTS[(dhp + inner) % 3]  # full attention in a different layout per grid
    cases = [Case(algorithm, world, layout, causal, batch=1, seq_len=32, heads=8, kv_heads=kv,
                  seed=seed + kv, options=options)
             for layout, causal in [*((lay, True) for lay in LAYOUTS), (full_layout, False)]
             for kv in (8, 2)]
    if world == 8 and not FULL:  # make test: each P = 8 grid half its cases, MHA and GQA by turns
        turn = (dhp + inner + PLACEMENTS.index(placement)) % 2
        cases = [c for i, c in enumerate(cases) if i % 2 == turn]
    per_rank = gang.run(_batch, cases, size=world, mesh=mesh_key(cases[0]))
    for i, case in enumerate(cases):
        result = evaluate(case, [rank[i] for rank in per_rank])
        assert result.ok, f"{case.label()}: {result.failures}"


def _links(env, case: Case):
    """rank_run on a mesh that knows the nodes: bytes by (op, link, phase) for this rank."""
    with algorithms.recording() as ledger:
        rank_run(env, case)
    split: dict[tuple[str, str, str], int] = {}
    for e in ledger.entries.values():
        key = (e.op, e.link, e.phase)
        split[key] = split.get(key, 0) + e.bytes_sent
    return split


def _link_case(dhp: int, placement: str, seed: int) -> Case:
    options = (("dhp", dhp), ("placement", placement))
    return Case("usp", 8, "zigzag", True, batch=1, seq_len=32, heads=8, kv_heads=2, seed=seed,
                options=options)


@pytest.mark.multirank
@pytest.mark.parametrize("dhp", [2, 4])
def test_placement_decides_which_traffic_crosses_nodes(gang, dhp, seed):
    """On 2 nodes x 4, head-first keeps the all-to-all intra-node and sends the ring across nodes;
    context-first the reverse. Per rank, each op's bytes equal §4.5's count in both phases."""
    totals = {}
    for placement in PLACEMENTS:
        case = _link_case(dhp, placement, seed)
        want = usp.bytes_by_op(case.shape, 8, dict(case.options))
        splits = gang.run(_links, case, size=8, mesh=mesh_key(case, NODES))
        for split in splits:
            for phase, ops in want.items():
                for op, nbytes in ops.items():
                    got = sum(split.get((op, link, phase), 0) for link in ("intra", "inter"))
                    assert got == nbytes, (placement, phase, op)
        totals[placement] = {(op, link): sum(s.get((op, link, p), 0) for s in splits
                                             for p in ("forward", "backward"))
                             for op in ("all_to_all", "p2p") for link in ("intra", "inter")}
    hf, cf = totals["head-first"], totals["context-first"]
    assert hf[("all_to_all", "inter")] == 0 and hf[("all_to_all", "intra")] > 0
    assert hf[("p2p", "inter")] > 0
    assert cf[("p2p", "inter")] == 0 and cf[("p2p", "intra")] > 0
    assert cf[("all_to_all", "inter")] > 0
    if dhp == 4:  # a CP group of 2 is split across the nodes: every ring byte is inter-node
        assert hf[("p2p", "intra")] == 0
    else:  # an HP group of 2 pairs rank i with rank i + 4: every all-to-all byte is inter-node
        assert cf[("all_to_all", "intra")] == 0


@pytest.mark.multirank
def test_double_ring_sends_only_outer_steps_across_nodes(gang, seed):
    """P = 8, inner rings of 4 = the nodes: forward crosses nodes once (the outer prefetch),
    backward three times (the prefetch and two dK,dV hops between inner rings); all else intra."""
    case = Case("double_ring", 8, "zigzag", True, batch=1, seq_len=32, heads=8, kv_heads=2,
                seed=seed, options=(("inner_ring", 4),))
    kv = 2 * case.kv_heads * case.shape.unit(8)
    for split in gang.run(_links, case, size=8, mesh=mesh_key(case, NODES)):
        assert split.get(("p2p", "inter", "forward")) == 1 * kv
        assert split.get(("p2p", "intra", "forward")) == 6 * kv
        assert split.get(("p2p", "inter", "backward")) == 3 * kv
        assert split.get(("p2p", "intra", "backward")) == 12 * kv


def _same_as(gang, cases):
    """rank_run of each case on its own mesh, per rank: [rank][case]."""
    runs = [gang.run(rank_run, case, size=case.world, mesh=mesh_key(case)) for case in cases]
    return [list(per_case) for per_case in zip(*runs, strict=True)]


@pytest.mark.multirank
@pytest.mark.parametrize(("base", "options"), [
    ("ring", (("dhp", 1),)),
    ("ring", (("dhp", 1), ("placement", "context-first"))),
    ("ulysses", (("dhp", 4),)),
])
def test_usp_reduces_to_ring_and_ulysses(gang, base, options, seed):
    """dhp = 1 is ring and dcp = 1 is ulysses: the same shards, bit for bit, and the same bytes."""
    cases = [Case(base, 4, layout, True, batch=1, seq_len=32, heads=8, kv_heads=2, seed=seed)
             for layout in LAYOUTS]
    cases += [dataclasses.replace(c, algorithm="usp", options=options) for c in cases]
    per_rank = _same_as(gang, cases)
    n = len(LAYOUTS)
    for rank in per_rank:
        for theirs, ours in zip(rank[:n], rank[n:], strict=True):
            assert ours.bytes_sent == theirs.bytes_sent
            for name, t in theirs.shards.items():
                assert torch.equal(ours.shards[name], t), name


def _build(env, options):
    try:
        with algorithms.recording() as ledger:
            algorithms.build_attention("usp", causal=True, layout="zigzag", group=env.group(4),
                                       **options)
    except SeqparError as err:
        return str(err), ledger.total()
    return None, ledger.total()


@pytest.mark.multirank
def test_bad_grid_is_refused_at_build_before_any_communication(gang):
    for message, nbytes in gang.run(_build, {"dhp": 2, "inner_ring": 4}, size=4):
        assert message == "inner_ring=4: must be a positive divisor of dcp (2)" and nbytes == 0
    shape = AttnShape(1, 32, 8, 2, 8)
    assert algorithms.expected_bytes("usp", shape, 4, dhp=2, inner_ring=1)["forward"] > 0


@pytest.mark.multirank
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_usp_and_double_ring_within_low_precision_tolerance(gang, dtype, seed):
    """GQA 8/2 at P = 4: usp 2 x 2 with a double ring (w = 1), context-first, and the double ring
    of 2; bf16 gradients ride the rings in float32."""
    cases = [Case(algorithm, 4, "zigzag", True, batch=1, seq_len=64, heads=8, kv_heads=2,
                  dtype=dtype, seed=seed, options=options)
             for algorithm, options in (
                 ("usp", (("dhp", 2), ("inner_ring", 1))),
                 ("usp", (("dhp", 2), ("placement", "context-first"))),
                 ("double_ring", (("inner_ring", 2),)))]
    for case in cases:
        result = evaluate(case, gang.run(rank_run, case, size=4, mesh=mesh_key(case)))
        assert result.ok, f"{case.label()}: {result.failures}"


def _labels(env, case: Case, use_mesh: bool) -> set[str]:
    attn = algorithms.build_attention(case.algorithm, causal=True, layout=case.layout,
                                      group=env.group(case.world),
                                      mesh=env.mesh if use_mesh else None, **dict(case.options))
    q = torch.randn(1, case.seq_len // case.world, case.heads, case.head_dim, dtype=torch.float64)
    k = torch.randn(1, case.seq_len // case.world, case.kv_heads, case.head_dim,
                    dtype=torch.float64)
    with algorithms.recording() as book:
        attn(q, k, k.clone())
    return {e.group for e in book.entries.values()}


@pytest.mark.multirank
def test_mesh_axes_are_process_groups_and_views_say_so(gang):
    """Built collectively (the gang's mesh) every axis is a group of its own and is booked by its
    name; built from a group that is not the whole world (P = 4 in a gang of 8) the axes are views
    of that group, booked as such."""
    case = Case("usp", 4, "zigzag", True, batch=1, seq_len=32, heads=8, kv_heads=2,
                options=(("dhp", 2), ("inner_ring", 1)))
    real = gang.run(_labels, case, True, size=4, mesh=mesh_key(case))
    views = gang.run(_labels, case, False, size=4)
    assert all(labels == {"hp", "outer"} for labels in real), real
    assert all(labels == {"hp(view)", "outer(view)"} for labels in views), views
