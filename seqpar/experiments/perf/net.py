"""Where ranks sit and what a transfer costs: intra-node links, NICs shared by several GPUs.

Ranks are dealt to nodes in blocks of consecutive ranks (rank r on node r // ranks_per_node, the
platform's and the papers' convention). A GPU's inter-node traffic leaves by its NIC
(`Cluster.nic_of`); when k concurrent senders use one NIC each gets 1/k of it (link contention).
Intra-node transfers use the GPU's own NVLink share (a switch: no contention).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from seqpar.experiments.clusters import Cluster


@dataclass(frozen=True)
class Cost:
    """Seconds of a communication stage, and the busiest rank's bytes by link class."""

    seconds: float
    intra: int = 0
    inter: int = 0

    @property
    def link(self) -> str:
        return "inter" if self.inter else "intra"


@dataclass(frozen=True)
class Net:
    cluster: Cluster
    world: int
    nodes: int = 1

    @cached_property
    def ranks_per_node(self) -> int:
        return max(1, self.world // self.nodes)

    def node(self, rank: int) -> int:
        return rank // self.ranks_per_node

    @cached_property
    def _nics(self) -> tuple[tuple[int, int], ...]:
        per = self.ranks_per_node
        return tuple((r // per, self.cluster.nic_of(r % per, per)) for r in range(self.world))

    def nic(self, rank: int) -> tuple[int, int]:
        return self._nics[rank]

    def p2p(self, pairs: Sequence[tuple[int, int]], nbytes: int) -> Cost:
        """Concurrent sends of nbytes each, (src, dst) pairs; the slowest sets the time."""
        pairs = [(s, d) for s, d in pairs if s != d]
        if not pairs or nbytes <= 0:
            return Cost(0.0)
        crossing = [(s, d) for s, d in pairs if self.node(s) != self.node(d)]
        share = Counter(self.nic(s) for s, _ in crossing)
        t_inter = max((self.cluster.inter.seconds(nbytes, share[self.nic(s)]) for s, _ in crossing),
                      default=0.0)
        t_intra = self.cluster.intra.seconds(nbytes) if len(crossing) < len(pairs) else 0.0
        if crossing:
            return Cost(max(t_inter, t_intra), 0, nbytes)
        return Cost(t_intra, nbytes, 0)

    def collective(self, groups: Sequence[Sequence[int]], nbytes: int) -> Cost:
        """All groups at once, each rank sending nbytes spread evenly over its group's other
        members (all-to-all, all-gather, reduce-scatter alike): per rank, the intra share over
        NVLink and the inter share over its NIC (shared by its NIC's other senders), both at once."""
        if nbytes <= 0:
            return Cost(0.0)
        inter_of: dict[int, float] = {}
        intra_of: dict[int, float] = {}
        for group in groups:
            m = len(group)
            if m < 2:
                continue
            for r in group:
                off = sum(1 for o in group if self.node(o) != self.node(r))
                inter_of[r] = nbytes * off / (m - 1)
                intra_of[r] = nbytes - inter_of[r]
        if not inter_of:
            return Cost(0.0)
        share = Counter(self.nic(r) for r, b in inter_of.items() if b > 0)
        c = self.cluster
        worst, busiest = 0.0, max(inter_of, key=lambda r: (inter_of[r], r))
        for r in inter_of:  # every peer posted at once: one latency per link class
            t = max(c.intra.seconds(intra_of[r]), c.inter.seconds(inter_of[r], share[self.nic(r)]))
            worst = max(worst, t)
        return Cost(worst, round(intra_of[busiest]), round(inter_of[busiest]))
