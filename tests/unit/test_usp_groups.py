"""LoongTrain 2D rank maths (groups.py): the grid, placements (Fig. 11), double-ring schedules; usp's
rules and analytic bytes (§4.5.3-4.5.4)."""

from __future__ import annotations

import itertools

import pytest

from seqpar import algorithms
from seqpar.algorithms import AttnShape, usp
from seqpar.errors import ConfigError
from seqpar.rules import groups

NODE_OF_8 = [r // 4 for r in range(8)]  # 2 nodes x 4 ranks, nodes are blocks of consecutive ranks

# LoongTrain Fig. 11, 8 GPUs on 2 nodes x 4, written out from the figure (dhp = 2, dcp = 4):
# (a) head-first: GPUs 0 and 1 share an HP group, GPUs of a CP group stride across both nodes;
# (b) context-first: GPUs 0-3 form one CP group, an HP group pairs GPU i with GPU i + 4.
FIG11 = {
    (2, 4, "head-first"): ([[0, 1], [2, 3], [4, 5], [6, 7]], [[0, 2, 4, 6], [1, 3, 5, 7]]),
    (2, 4, "context-first"): ([[0, 4], [1, 5], [2, 6], [3, 7]], [[0, 1, 2, 3], [4, 5, 6, 7]]),
    # the same rule with dhp = 4, dcp = 2
    (4, 2, "head-first"): ([[0, 1, 2, 3], [4, 5, 6, 7]], [[0, 4], [1, 5], [2, 6], [3, 7]]),
    (4, 2, "context-first"): ([[0, 2, 4, 6], [1, 3, 5, 7]], [[0, 1], [2, 3], [4, 5], [6, 7]]),
}


@pytest.mark.parametrize(("dhp", "dcp", "placement"), list(FIG11))
def test_rank_maps_match_loongtrain_figure_11(dhp, dcp, placement):
    hp_want, cp_want = FIG11[(dhp, dcp, placement)]
    assert groups.usp_hp_groups(dhp, dcp, placement) == hp_want
    assert groups.usp_cp_groups(dhp, dcp, placement) == cp_want
    for rank in range(8):  # a rank's coordinates are its positions in its HP and CP groups
        a, b = groups.usp_coords(rank, dhp, dcp, placement)
        assert hp_want[b][a] == rank and cp_want[a][b] == rank


@pytest.mark.parametrize(("dhp", "dcp"), [(2, 4), (4, 2)])
def test_head_first_colocates_hp_groups_and_context_first_cp_groups(dhp, dcp):
    def one_node(group):
        return len({NODE_OF_8[r] for r in group}) == 1

    assert groups.usp_colocated(dhp, dcp, "head-first") == groups.usp_hp_groups(dhp, dcp, "head-first")
    assert all(one_node(g) for g in groups.usp_hp_groups(dhp, dcp, "head-first"))
    assert not any(one_node(g) for g in groups.usp_cp_groups(dhp, dcp, "head-first"))
    assert all(one_node(g) for g in groups.usp_cp_groups(dhp, dcp, "context-first"))
    assert not any(one_node(g) for g in groups.usp_hp_groups(dhp, dcp, "context-first"))


def test_inner_and_outer_rings_of_loongtrain_figure_9():
    # dcp = 8, inner ring 4, outer ring 2
    assert groups.inner_rings(8, 4) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert groups.outer_rings(8, 4) == [[0, 4], [1, 5], [2, 6], [3, 7]]


@pytest.mark.parametrize(("size", "inner"), [(8, 8), (8, 4), (8, 2), (8, 1), (6, 3), (4, 2), (1, 1)])
def test_double_ring_schedule_visits_every_block_once_and_brings_grads_home(size, inner):
    rings = [groups.NestedRing(size, inner, p) for p in range(size)]
    steps = [(o, s) for o in range(size // inner) for s in range(inner)]
    for ring in rings:
        held = [ring.source(o, s) for o, s in steps]
        assert sorted(held) == list(range(size))  # every block exactly once
        assert held[0] == ring.pos
    for k, (o, s) in enumerate(steps):
        for ring in rings:
            block = ring.source(o, s)
            if s > 0:  # inside an inner ring the block came from prev_inner's previous step
                assert rings[ring.prev_inner].source(o, s - 1) == block
            elif o > 0:  # the outer prefetch: prev_outer's first block of the previous step
                assert rings[ring.prev_outer].source(o - 1, 0) == block
            to, frm = ring.grad_peers(s)
            assert rings[to].grad_peers(s)[1] == ring.pos  # receive is the inverse of send
            if k + 1 < len(steps):  # dK,dV go to the block's next holder ...
                assert rings[to].source(*steps[k + 1]) == block
            else:  # ... and after the last step home
                assert to == block


def test_one_inner_ring_is_the_plain_ring():
    for p in range(5):
        ring = groups.NestedRing(5, 5, p)
        assert ring.outer == 1 and ring.next_inner == (p + 1) % 5 and ring.prev_inner == (p - 1) % 5
        assert [ring.source(0, s) for s in range(5)] == [(p - s) % 5 for s in range(5)]
        assert all(ring.grad_peers(s) == ((p + 1) % 5, (p - 1) % 5) for s in range(5))


SHAPE = AttnShape(batch=1, seq_len=64, heads=8, kv_heads=2, head_dim=16, elem_bytes=2)


def test_usp_bytes_follow_loongtrain_performance_model():
    u = 1 * 8 * 16 * 2  # B * (N / P) * D * e at P = 8
    # dhp = 4 > Hkv = 2: K,V replicated to 4 heads. AlltoAll_Volume = (dhp-1)/dhp * (2H + 2*4) * u
    a2a = 3 * (2 * 8 + 2 * 4) * u // 4
    kv = 2 * 4 * u  # Size(kv): H/dhp heads of N/dcp tokens, replicated K,V
    got = usp.bytes_by_op(SHAPE, 8, {"dhp": 4, "placement": "context-first",
                                     "grad_dtype": "input"})
    assert got == {"forward": {"all_to_all": a2a, "p2p": 1 * kv},
                   "backward": {"all_to_all": a2a, "p2p": 3 * kv}}
    # by default the dK,dV messages (2 of the 3) travel in float32, twice the 2-byte input
    got = usp.bytes_by_op(SHAPE, 8, {"dhp": 4, "placement": "context-first"})
    assert got["backward"] == {"all_to_all": a2a, "p2p": 1 * kv + 2 * 2 * kv}
    assert algorithms.expected_bytes("usp", SHAPE, 8, dhp=4, grad_dtype="input") == {
        "forward": a2a + kv, "backward": a2a + 3 * kv}


@pytest.mark.parametrize("world", [2, 4, 8])
def test_usp_bytes_reduce_to_ring_and_ulysses(world):
    ring = algorithms.expected_bytes("ring", SHAPE, world)
    for inner in (w for w in range(1, world + 1) if world % w == 0):  # the double ring costs the same
        assert algorithms.expected_bytes("usp", SHAPE, world, dhp=1, inner_ring=inner) == ring
        assert algorithms.expected_bytes("double_ring", SHAPE, world, inner_ring=inner) == ring
    assert algorithms.expected_bytes("usp", SHAPE, world, dhp=world) == \
        algorithms.expected_bytes("ulysses", SHAPE, world)


@pytest.mark.parametrize(("options", "match"), [
    ({"dhp": 3}, "dhp=3.*divisor of the world size"),
    ({"dhp": 2, "dcp": 2}, "dcp=2.*dhp \\* dcp must equal the world size \\(8\\)"),
    ({"dhp": 2, "inner_ring": 3}, "inner_ring=3.*divisor of dcp \\(4\\)"),
    ({"dhp": 2, "placement": "rack-first"}, "placement='rack-first'"),
    ({"dhp": 8, "dcp": 1, "bogus": 1}, "option='bogus'"),
])
def test_bad_usp_grids_name_field_value_and_rule(options, match):
    with pytest.raises(ConfigError, match=match):
        algorithms.check("usp", SHAPE, 8, "zigzag", **options)


def test_usp_head_rules():
    with pytest.raises(ConfigError, match="heads=6.*divisible by dhp \\(4\\)"):
        algorithms.check("usp", AttnShape(1, 64, 6, 6, 8), 8, dhp=4)
    # kv_heads neither a multiple nor a divisor of dhp: K,V heads by per-member ranges
    algorithms.check("usp", AttnShape(1, 64, 6, 3, 8), 8, dhp=2)
    with pytest.raises(ConfigError, match="option='dhp'"):
        algorithms.check("double_ring", SHAPE, 8, dhp=2)
    for dhp, inner in itertools.product((1, 2, 4, 8), (1, 2)):
        if (8 // dhp) % inner == 0:
            algorithms.check("usp", SHAPE, 8, "stripe", dhp=dhp, inner_ring=inner)
