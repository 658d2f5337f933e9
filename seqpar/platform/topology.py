"""Which node each rank is on: real Ray nodes, or virtual nodes on one machine.

The plan is always `nodes x ranks_per_node` with rank r on node r // ranks_per_node. A gang on a real
multi-node cluster reports the Ray node id of each actor; ranks on one Ray node form one node of the
real map, which must *be* the plan (`check_placement`): a map that interleaves nodes or puts two
planned nodes on one machine is refused, never run under another map. On one machine every actor
shares a node, so the plan stands in as a *virtual* topology: the ledger classifies transfers with
it and link emulation slows the inter-node ones, so placement studies mean something on a laptop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


class PlacementError(RuntimeError):
    """The ranks' real Ray nodes do not form the planned map."""


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


def virtual(world: int, ranks_per_node: int) -> Topology:
    """Rank r on virtual node r // ranks_per_node."""
    return Topology(tuple(r // ranks_per_node for r in range(world)), "virtual")


def from_node_ids(node_ids: Sequence[str]) -> Topology:
    """The real map: nodes numbered in order of their first rank."""
    index: dict[str, int] = {}
    return Topology(tuple(index.setdefault(n, len(index)) for n in node_ids), "real")


def check_placement(node_ids: Sequence[str], ranks_per_node: int) -> Topology:
    """The real map of ranks placed node by node, when it is the plan; else PlacementError naming
    the planned map, the real one and the Ray nodes."""
    real, plan = from_node_ids(node_ids), virtual(len(node_ids), ranks_per_node)
    if real.node_of_rank != plan.node_of_rank:
        ids = dict.fromkeys(node_ids)  # in order of their first rank, as the real map numbers them
        raise PlacementError(
            f"ranks placed on the wrong Ray nodes: planned rank->node map "
            f"{list(plan.node_of_rank)}, real {list(real.node_of_rank)} "
            f"(real node i = Ray node {', '.join(f'{i}: {n[:8]}' for i, n in enumerate(ids))})")
    return real


def resolve(node_ids: Sequence[str], ranks_per_node: int) -> Topology:
    """The virtual map when every actor shares one Ray node; else the real map, which must be the
    plan (check_placement; a gang is checked when it starts, so this raises only for a map that
    was never checked)."""
    if len(set(node_ids)) > 1:
        return check_placement(node_ids, ranks_per_node)
    return virtual(len(node_ids), ranks_per_node)
