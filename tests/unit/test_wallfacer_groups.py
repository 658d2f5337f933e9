"""WallFacer's rank maths (Alg. 2 get_init_send, Alg. 3 get_P2P_config, placements) and burst's
topology-aware ring, as pure functions: no processes."""

from __future__ import annotations

from collections import Counter

import pytest

from seqpar import algorithms
from seqpar.algorithms import AttnShape
from seqpar.errors import ConfigError
from seqpar.rules.groups import (
    WALLFACER_PLACEMENTS,
    WallFacerGrid,
    burst_ring,
    get_init_send,
    node_block_size,
)

GRIDS = [(8, 1), (8, 2), (16, 2), (16, 4), (4, 2), (36, 3)]


def test_fig5_eight_gpus_four_subrings():
    """P = 8, C = 2 (teams within nodes): the paper's Fig. 5 initialisation."""
    g = WallFacerGrid(8, 2, "collective-intra")
    assert [g.team(r) for r in (0, 2, 4, 6)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert [g.init_send(r) for r in range(8)] == [0, 4, 1, 5, 2, 6, 3, 7]
    assert [g.init_recv(r) for r in range(8)] == [0, 2, 4, 6, 1, 3, 5, 7]
    assert [g.block_team(r) for r in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    # team group {team 0, team 1} rings only among ranks 0-3, {team 2, team 3} among 4-7
    assert sorted({tuple(g.subring(r)) for r in range(8)}) == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert g.ring_size == 2


def test_alg2_is_the_papers_formula():
    # team 3 (of d_t = 8 teams of d_a = 2), member 1 -> team group 1, team 1*4 + 3//2 = 5, member 1
    assert get_init_send(3, 1, 8, 2) == 5 * 2 + 1


@pytest.mark.parametrize("placement", WALLFACER_PLACEMENTS)
@pytest.mark.parametrize(("world", "c"), GRIDS)
def test_teams_and_subrings_cover_every_shard_once(world, c, placement):
    g = WallFacerGrid(world, c, placement)
    ranks = range(world)
    assert sorted(g.init_send(r) for r in ranks) == list(ranks)  # a permutation ...
    assert all(g.init_recv(g.init_send(r)) == r for r in ranks)  # ... and init_recv its inverse
    for team in range(g.teams):
        members = g.members(team)
        assert members == sorted(members) and [g.coords(m) for m in members] == [
            (team, a) for a in range(c)]
        # every team member holds a different K,V block
        assert len({g.block_team(m) for m in members}) == c
        # the team's members' sub-rings together visit every team's block (every shard) once
        visited = Counter(g.block_team(x) for m in members for x in g.subring(m))
        assert visited == Counter(range(g.teams))
    for r in ranks:
        ring = g.subring(r)
        assert ring == sorted(ring) and len(ring) == g.ring_size
        j = ring.index(r)
        assert g.p2p(r) == (ring[(j + 1) % len(ring)], ring[j - 1])  # Alg. 3 = ring order
    # no two teams of one team group (the teams sharing sub-rings) hold the same block
    for first in range(0, g.teams, g.ring_size):
        held = [g.block_team(m) for t in range(first, first + g.ring_size) for m in g.members(t)]
        assert sorted(held) == list(range(g.teams))


@pytest.mark.parametrize(("world", "c"), [(8, 2), (16, 2), (16, 4)])
def test_placement_puts_teams_or_subrings_on_consecutive_ranks(world, c):
    coll, p2p = WallFacerGrid(world, c, "collective-intra"), WallFacerGrid(world, c, "p2p-intra")
    assert all(coll.team(r) == list(range(r - r % c, r - r % c + c)) for r in range(world))
    t = world // c ** 2
    assert all(p2p.subring(r) == list(range(r - r % t, r - r % t + t)) for r in range(world))


def test_extremes_c1_is_the_ring_and_c_sqrt_p_has_no_ring():
    ring = WallFacerGrid(8, 1)
    assert [ring.init_send(r) for r in range(8)] == list(range(8))
    assert ring.subring(5) == list(range(8)) and ring.p2p(7) == (0, 6)
    full = WallFacerGrid(16, 4, "p2p-intra")
    assert full.ring_size == 1 and all(full.subring(r) == [r] for r in range(16))


@pytest.mark.parametrize(("c", "placement", "match"), [
    (3, "collective-intra", "team_size=3"), (4, "collective-intra", "team_size=4"),
    (0, "collective-intra", "team_size=0"), (2, "ring-intra", "placement='ring-intra'")])
def test_bad_team_size_or_placement_is_refused(c, placement, match):
    with pytest.raises(ConfigError, match=match):
        algorithms.check("wallfacer", AttnShape(1, 64, 8, 8, 8), 8, "zigzag",
                         team_size=c, placement=placement)


SHAPE = AttnShape(batch=2, seq_len=64, heads=8, kv_heads=2, head_dim=16, elem_bytes=2)


def test_wallfacer_bytes_follow_eq6_and_eq7():
    """P = 16, C = 2, GQA (8/2) in bf16: collectives 3(C-1) shards of q,k,v heads plus the
    combine; p2p (P/C²) blocks of 2C*Hkv*u for a rank that places its block elsewhere."""
    p, c, t = 16, 2, 4
    u, h, hkv = SHAPE.unit(p), SHAPE.heads, SHAPE.kv_heads
    spec = algorithms.get("wallfacer")
    opts = {"team_size": c}
    stats = 2 * (64 // p) * h * 4  # one shard's lse in float32
    combine = (c - 1) * (2 * h * u + stats)  # out travels in float32: 2x the bf16 bytes
    mover = next(r for r in range(p) if WallFacerGrid(p, c).init_send(r) != r)
    stayer = next(r for r in range(p) if WallFacerGrid(p, c).init_send(r) == r)
    block = 2 * c * hkv * u
    gather = (c - 1) * (h + 2 * hkv) * u
    assert spec.bytes_of_rank(SHAPE, p, opts, mover)["forward"] == gather + t * block + combine
    assert spec.bytes_of_rank(SHAPE, p, opts, stayer)["forward"] == (
        gather + (t - 1) * block + combine)
    assert algorithms.expected_bytes("wallfacer", SHAPE, p, **opts)["forward"] == (
        gather + t * block + combine)


def test_wallfacer_c1_forward_is_ring_and_backward_is_burst():
    for world in (2, 4, 8):
        wf = algorithms.expected_bytes("wallfacer", SHAPE, world, team_size=1)
        assert wf["forward"] == algorithms.expected_bytes("ring", SHAPE, world)["forward"]
        assert wf["backward"] == algorithms.expected_bytes("burst", SHAPE, world)["backward"]


@pytest.mark.parametrize(("heads", "kv_heads", "burst_sends_less"), [(8, 8, True), (8, 2, False)])
def test_burst_backward_bytes_against_ring(heads, kv_heads, burst_sends_less):
    """MHA: (P-1)(2Hd+2H)+P*Hd against (2P-1)*2Hd, -> (3d+2)/(4d); GQA 4: burst sends more."""
    shape = AttnShape(1, 64, heads, kv_heads, 16, elem_bytes=4)
    burst = algorithms.expected_bytes("burst", shape, 8)["backward"]
    ring = algorithms.expected_bytes("ring", shape, 8)["backward"]
    d, p = 16, 8
    want = ((p - 1) * (2 * d + 2) + p * d) / ((2 * p - 1) * 2 * d) * heads / kv_heads
    assert burst / ring == pytest.approx(want)
    assert (burst < ring) == burst_sends_less


def test_burst_ring_follows_the_nodes():
    assert node_block_size([0, 0, 0, 0, 1, 1, 1, 1]) == 4
    assert node_block_size([0, 0, 1, 1, 1]) == 5        # uneven nodes: one flat ring
    assert node_block_size([0, 1, 0, 1]) == 4           # a node's ranks not consecutive: flat
    assert node_block_size([3, 3, 3]) == 3
    r = burst_ring([0, 0, 0, 0, 1, 1, 1, 1], 5)
    assert (r.inner, r.outer, r.next_inner, r.prev_inner, r.next_outer) == (4, 2, 6, 4, 1)
    # after the intra-node sub-ring, dq jumps diagonally to the next node's next position
    assert r.grad_peers(3) == (2, 0)
