"""Rank -> node maps: the virtual nodes x ranks_per_node plan and real Ray node ids (no Ray)."""

from __future__ import annotations

import pytest

from seqpar.platform import topology


def test_virtual_topology_puts_consecutive_ranks_on_one_node():
    topo = topology.virtual(8, 4)
    assert topo.node_of_rank == (0, 0, 0, 0, 1, 1, 1, 1)
    assert (topo.nodes, topo.kind) == (2, "virtual")
    assert topo.link(3, 4) == "inter" and topo.link(4, 7) == "intra"


def test_real_topology_numbers_nodes_by_their_first_rank():
    topo = topology.from_node_ids(["b", "b", "a", "a", "c"])
    assert topo.node_of_rank == (0, 0, 1, 1, 2)
    assert topo.kind == "real"


def test_resolve_uses_virtual_nodes_when_every_actor_shares_one_ray_node():
    topo = topology.resolve(["n"] * 4, 2)
    assert (topo.node_of_rank, topo.kind) == ((0, 0, 1, 1), "virtual")
    topo = topology.resolve(["m", "m", "n", "n"], 2)
    assert (topo.node_of_rank, topo.kind) == ((0, 0, 1, 1), "real")


@pytest.mark.parametrize("node_ids", [
    ["n", "m", "n", "m"],            # interleaved
    ["n", "n", "n", "m"],            # a planned node split over two machines
    ["n", "n", "m", "m", "m", "m"],  # the second planned node on the first's machine too
])
def test_a_real_map_other_than_the_plan_is_refused_naming_both(node_ids):
    real = topology.from_node_ids(node_ids).node_of_rank
    with pytest.raises(topology.PlacementError) as info:
        topology.check_placement(node_ids, 2)
    plan = topology.virtual(len(node_ids), 2).node_of_rank
    assert f"planned rank->node map {list(plan)}, real {list(real)}" in str(info.value)
    with pytest.raises(topology.PlacementError):
        topology.resolve(node_ids, 2)


def test_the_planned_map_on_real_nodes_is_accepted():
    topo = topology.check_placement(["b", "b", "b", "a", "a", "a"], 3)
    assert (topo.node_of_rank, topo.kind) == ((0, 0, 0, 1, 1, 1), "real")


def test_a_plan_with_more_nodes_than_the_ray_cluster_fails_at_once(monkeypatch):
    from seqpar.platform import cluster

    monkeypatch.setattr(cluster, "alive_nodes", lambda: [{"Resources": {"CPU": 8}}] * 2)
    key = cluster.GangKey("more-nodes", world=6, device="cpu", ranks_per_node=2)
    with pytest.raises(cluster.GangStartupError, match="the plan has 3 nodes, the Ray cluster 2"):
        cluster.start_gang(object, key, 2, ready_timeout_s=1)
