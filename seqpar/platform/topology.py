"""Which node each rank is on: real Ray nodes, or virtual nodes on one machine.

A gang on a real multi-node cluster reports the Ray node id of each actor; ranks on one node form one
node of the map. On one machine every actor shares a node, so a *virtual* topology
`nodes x ranks_per_node` stands in (rank r is on node r // ranks_per_node): the ledger classifies
transfers with it and link emulation slows the inter-node ones, so placement studies mean something
on a laptop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from seqpar.errors import require


@dataclass(frozen=True)
class Topology:
    """rank -> node index; `kind` says whether the nodes are 'virtual' or 'real' Ray nodes."""

    node_of_rank: tuple[int, ...]
    kind: str  # "virtual" | "real"

    @property
    def world(self) -> int:
        return len(self.node_of_rank)

    @property
    def nodes(self) -> int:
        return len(set(self.node_of_rank))

    def link(self, rank_a: int, rank_b: int) -> str:
        """'intra' when both ranks share a node, else 'inter' (the ledger's link classes)."""
        return "intra" if self.node_of_rank[rank_a] == self.node_of_rank[rank_b] else "inter"


def plan_shape(world: int, nodes: int, ranks_per_node: int | None) -> tuple[int, int]:
    """(nodes, ranks_per_node) for a gang of `world` ranks; raises ConfigError when they disagree."""
    require(isinstance(nodes, int) and nodes >= 1, "nodes", nodes, "must be a positive integer")
    if ranks_per_node is None:
        require(world % nodes == 0, "nodes", nodes, f"must divide the world size ({world})")
        ranks_per_node = world // nodes
    require(isinstance(ranks_per_node, int) and ranks_per_node >= 1, "ranks_per_node",
            ranks_per_node, "must be a positive integer")
    require(nodes * ranks_per_node == world, "ranks_per_node", ranks_per_node,
            f"nodes ({nodes}) x ranks_per_node must equal the world size ({world})")
    return nodes, ranks_per_node


def virtual(world: int, ranks_per_node: int) -> Topology:
    """Rank r on virtual node r // ranks_per_node."""
    return Topology(tuple(r // ranks_per_node for r in range(world)), "virtual")


def from_node_ids(node_ids: Sequence[str]) -> Topology:
    """The real map: nodes numbered in order of their first rank."""
    index: dict[str, int] = {}
    return Topology(tuple(index.setdefault(n, len(index)) for n in node_ids), "real")


def resolve(node_ids: Sequence[str], ranks_per_node: int) -> Topology:
    """Real topology when the actors span several Ray nodes, else the virtual one."""
    if len(set(node_ids)) > 1:
        return from_node_ids(node_ids)
    return virtual(len(node_ids), ranks_per_node)
