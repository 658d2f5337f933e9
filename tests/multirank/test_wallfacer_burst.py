"""wallfacer and burst against float64 SDPA on the unsharded inputs (output, dq, dk, dv), every rank's
ledger against its analytic bytes, which traffic crosses nodes, burst's backward bytes against ring's,
and WallFacer's saved activations against Eq. 9-10."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from seqpar import algorithms
from seqpar.algorithms import burst, layouts
from seqpar.case import Case
from seqpar.rules.groups import WALLFACER_PLACEMENTS, WallFacerGrid
from seqpar.workers.measure.check import evaluate, mesh_key, rank_run, run_case
from seqpar.workers.measure.meters import SavedTensorMeter
from seqpar.workers.measure.reference import make_inputs

NODES = (0, 0, 0, 0, 1, 1, 1, 1)  # 2 virtual nodes x 4 ranks


def check_all(gang, cases: list[Case]):
    results = []
    for case in cases:
        result = evaluate(case, run_case(gang, case))
        assert result.ok, f"{case.label()}: {result.failures}"
        results.append(result)
    return results


def heads_for(world: int, gqa: bool) -> tuple[int, int]:
    if world == 3:
        return (6, 3) if gqa else (6, 6)
    return (8, 2) if gqa else (8, 8)


@pytest.mark.multirank
@pytest.mark.parametrize(("world", "team_size"), [  # P = 8, C = 1 (a ring of 8): make test-full
    (4, 1), (4, 2), pytest.param(8, 1, marks=pytest.mark.slow), (8, 2)])
def test_wallfacer_matches_reference(gang, world, team_size, seed):
    """Both placements; causal in every layout (MHA and GQA) and full attention in every layout.
    P = 8, C = 2 is Fig. 5; P = 4, C = 2 = sqrt(P) has no ring step. Every rank's bytes equal
    rank_bytes exactly, and causal zigzag gives every rank the same work."""
    cases = [Case("wallfacer", world, layout, causal, batch=1, seq_len=32, heads=8, kv_heads=kv,
                  seed=seed + kv, options=(("placement", placement), ("team_size", team_size)))
             for placement in WALLFACER_PLACEMENTS
             for layout in ("contiguous", "zigzag", "stripe")
             for causal, kvs in ((True, (8, 2)), (False, (8,)))
             for kv in kvs]
    for result in check_all(gang, cases):  # §4.5: zigzag balances the teams' causal work
        if result.case.layout == "zigzag" and result.case.causal:
            assert len(set(result.flops_per_rank)) == 1, result.flops_per_rank


@pytest.mark.multirank
@pytest.mark.parametrize("world", [2, 3, 4, pytest.param(8, marks=pytest.mark.slow)])
def test_burst_matches_reference(gang, world, seed):
    cases = []
    for layout in ("contiguous", "zigzag", "stripe"):
        for causal in (True, False):
            for gqa in (False, True):
                heads, kv = heads_for(world, gqa)
                cases.append(Case("burst", world, layout, causal, batch=1, seq_len=48,
                                  heads=heads, kv_heads=kv, seed=seed + kv))
    for result in check_all(gang, cases):  # zigzag and stripe balance the causal work (§3.4)
        if result.case.layout != "contiguous":
            assert len(set(result.flops_per_rank)) == 1, (result.case.label(),
                                                          result.flops_per_rank)


@pytest.mark.multirank
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_low_precision_within_tolerance(gang, dtype, seed):
    """D and lse travel in float32 beside bf16 q and dO (one byte-packed message); the surrogate O'
    the kernels take keeps rowsum(dO * O') = D within bf16's tolerance."""
    cases = [Case(algorithm, 4, "zigzag", True, heads=8, kv_heads=2, dtype=dtype, seq_len=64,
                  seed=seed, options=options)
             for algorithm, options in (("burst", ()), ("wallfacer", (("team_size", 2),)))]
    check_all(gang, cases)


@pytest.mark.multirank
@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "stripe"])
def test_wallfacer_c1_is_ring_in_outputs_and_forward_bytes(gang, seed, layout):
    """C = 1: the same forward kernel calls as ring, so the same output bit for bit; the backward
    moves queries (burst's), so its gradients agree to rounding."""
    base = Case("ring", 4, layout, True, batch=1, seq_len=32, heads=8, kv_heads=2, seed=seed)
    wall = dataclasses.replace(base, algorithm="wallfacer", options=(("team_size", 1),))
    ring_runs, wall_runs = run_case(gang, base), run_case(gang, wall)
    assert evaluate(base, ring_runs).ok and evaluate(wall, wall_runs).ok
    for r, w in zip(ring_runs, wall_runs, strict=True):
        assert torch.equal(w.shards["out"], r.shards["out"])
        for name in ("dq", "dk", "dv"):
            torch.testing.assert_close(w.shards[name], r.shards[name], rtol=1e-10, atol=1e-12)
        assert w.bytes_sent["forward"] == r.bytes_sent["forward"]


def _links(env, case: Case):
    """rank_run on a mesh that knows the nodes: (result, bytes by (op, link, phase))."""
    with algorithms.recording() as book:
        result = rank_run(env, case)
    split: dict[tuple[str, str, str], int] = {}
    for e in book.entries.values():
        split[(e.op, e.link, e.phase)] = split.get((e.op, e.link, e.phase), 0) + e.bytes_sent
    return result, split


@pytest.mark.multirank
@pytest.mark.parametrize("from_mesh", [False, True])
def test_burst_ring_crosses_nodes_once_per_node_ring_does_every_step(gang, seed, from_mesh):
    """P = 8 on 2 nodes x 4: burst's rank sends 1 of its 7 K,V blocks across nodes (and in backward
    1 query block + 2 dq hops); ring's ranks 3 and 7 send all 7 across, the others none."""
    options = () if from_mesh else (("ranks_per_node", 4),)  # the node map, or the option
    case = Case("burst", 8, "stripe", True, batch=1, seq_len=32, heads=8, kv_heads=2, seed=seed,
                options=options)
    kv = 2 * case.kv_heads * case.shape.unit(8)
    qb, dq = burst.query_block_bytes(case.shape, 8)
    runs = gang.run(_links, case, size=8, mesh=mesh_key(case, NODES))
    assert evaluate(case, [r for r, _ in runs]).ok
    for _, split in runs:
        assert split[("p2p", "inter", "forward")] == kv
        assert split[("p2p", "intra", "forward")] == 6 * kv
        assert split[("p2p", "inter", "backward")] == qb + 2 * dq
        assert split[("p2p", "intra", "backward")] == 6 * qb + 6 * dq
    ring = dataclasses.replace(case, algorithm="ring", options=())
    inter = [s.get(("p2p", "inter", "forward"), 0)
             for _, s in gang.run(_links, ring, size=8, mesh=mesh_key(ring, NODES))]
    assert inter == [0, 0, 0, 7 * kv, 0, 0, 0, 7 * kv]


@pytest.mark.multirank
def test_wallfacer_bytes_by_op_follow_eq6_and_eq7(gang, seed):
    """P = 8, C = 2: per rank, the team all-gather is 3(C-1) shards (MHA), the combine (C-1) shards
    of out and lse, and p2p is P/C² team blocks of 2C shards (one fewer for a rank placing its
    block on itself); with collective-intra on 2 nodes x 4 the sub-rings stay inside a node."""
    case = Case("wallfacer", 8, "zigzag", True, batch=1, seq_len=32, heads=8, kv_heads=8,
                seed=seed, options=(("placement", "collective-intra"), ("team_size", 2)))
    u, s, h = case.shape.unit(8), 32 // 8, 8
    runs = gang.run(_links, case, size=8, mesh=mesh_key(case, NODES))
    assert evaluate(case, [r for r, _ in runs]).ok
    for rank, (_, split) in enumerate(runs):
        def fwd(op, split=split):
            return sum(split.get((op, link, "forward"), 0) for link in ("intra", "inter"))
        assert fwd("all_gather") == 3 * 1 * h * u
        assert fwd("all_to_all") == 1 * (h * u + 1 * s * h * 8)  # out + lse, float64
        placed = rank not in (0, 7)  # ranks 0 and 7 are their own Alg. 2 targets (Fig. 5)
        assert fwd("p2p") == (2 if placed else 1) * 2 * 2 * h * u
        assert split.get(("all_gather", "inter", "forward"), 0) == 0
        dst = WallFacerGrid(8, 2).init_send(rank)  # only the placement may leave the node
        crosses = NODES[dst] != NODES[rank]
        assert split.get(("p2p", "inter", "forward"), 0) == (2 * 2 * h * u if crosses else 0)

        # backward, by hand (float64: every stat and gradient is 8 bytes; u = 1*4*8*8 = 256 bytes,
        # a shard's D or lse = 1*4*8*8 = 256 bytes; every packed segment is a multiple of 16)
        def bwd(op, split=split):
            return sum(split.get((op, link, "backward"), 0) for link in ("intra", "inter"))
        assert u == 256
        assert bwd("all_gather") == 1 * (256 + 256 + 8 * 256)   # (C-1) x (D, lse, dO) of a shard
        assert bwd("reduce_scatter") == 1 * (8 + 2 * 8) * 256   # (C-1)/C of the team's dq,dk,dv
        query_block = 2 * 256 + 2 * 256 + 2 * 8 * 256 + 2 * 8 * 256  # D, lse, q, dO of 2 shards
        dq_block = 2 * 8 * 256
        sub_ring = 8 // 2 ** 2                                   # T = P / C² = 2 positions
        placed_home = 2 * 2 * 8 * 256 if placed else 0           # the team's dK,dV back home
        assert bwd("p2p") == ((sub_ring - 1) * query_block + sub_ring * dq_block + placed_home)


@pytest.mark.multirank
@pytest.mark.parametrize(("kv_heads", "burst_sends_less"), [(8, True), (2, False)])
def test_burst_backward_bytes_against_ring_measured(gang, seed, kv_heads, burst_sends_less):
    """Ledger, P = 4, d = 8, float64: MHA burst/ring = ((P-1)(2d+2) + P d) / ((2P-1) 2d) ~ 0.77
    (-> (3d+2)/4d); with GQA H/Hkv = 4 the same ratio times 4: burst sends more."""
    base = Case("ring", 4, "zigzag", True, batch=1, seq_len=32, heads=8, kv_heads=kv_heads,
                seed=seed)
    ring, bst = check_all(gang, [base, dataclasses.replace(base, algorithm="burst")])
    ratio = bst.bytes_measured["backward"] / ring.bytes_measured["backward"]
    d, p = 8, 4
    assert ratio == pytest.approx(((p - 1) * (2 * d + 2) + p * d) / ((2 * p - 1) * 2 * d)
                                  * 8 / kv_heads)
    assert (ratio < 1) == burst_sends_less
    assert bst.bytes_measured["forward"] == ring.bytes_measured["forward"]


def _saved_bytes(env, case: Case) -> int:
    """Bytes of the tensors one forward saves for backward (the attention's activation memory)."""
    full = make_inputs(case)
    local = {n: layouts.shard(t, case.layout, env.rank, case.world) for n, t in full.items()}
    q, k, v = (local[n].requires_grad_() for n in ("q", "k", "v"))
    attn = algorithms.build_attention(case.algorithm, causal=case.causal, layout=case.layout,
                                      mesh=env.mesh, **dict(case.options))
    with SavedTensorMeter() as saved:
        out = attn(q, k, v)
    out.backward(local["dout"])
    return saved.nbytes


@pytest.mark.multirank
def test_wallfacer_saves_3c_activations_against_ring_3(gang, seed):
    """Eq. 9-10: WallFacer keeps 3C activations A = B*s*H*D*e (the team's q and its placed K,V)
    where ring keeps 3, so the extra is 3(C-1)A per rank (MHA, P = 8, C = 2)."""
    ring = Case("ring", 8, "zigzag", True, batch=2, seq_len=64, heads=4, kv_heads=4, seed=seed)
    wall = dataclasses.replace(ring, algorithm="wallfacer", options=(("team_size", 2),))
    a = ring.shape.unit(8) * ring.heads
    per_ring = gang.run(_saved_bytes, ring, size=8, mesh=mesh_key(ring))
    per_wall = gang.run(_saved_bytes, wall, size=8, mesh=mesh_key(wall))
    for r, w in zip(per_ring, per_wall, strict=True):
        assert (w - r) == pytest.approx(3 * (2 - 1) * a, rel=0.1)
        assert r == pytest.approx(4 * a, rel=0.1)  # q, k, v, out (+ a small lse)
