"""Where ranks sit and what a transfer costs: intra-node links, NICs shared by several GPUs.

Ranks are dealt to nodes in blocks of consecutive ranks (rank r on node r // ranks_per_node, the
platform's and the papers' convention). A GPU's inter-node traffic leaves by its NIC
(`Cluster.nic_of`); when k concurrent senders use one NIC each gets 1/k of it (link contention).
Intra-node transfers use the GPU's own NVLink share (a switch: no contention).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

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
    def _nic_ids(self) -> np.ndarray:
        """Each rank's NIC as one integer (node, NIC of the node)."""
        per, c = self.ranks_per_node, self.cluster
        local = [c.nic_of(r, per) for r in range(per)]
        return np.array([(r // per) * c.nics_per_node + local[r % per] for r in range(self.world)])

    def nic(self, rank: int) -> int:
        return int(self._nic_ids[rank])

    def p2p(self, pairs: Sequence[tuple[int, int]] | np.ndarray, nbytes: int) -> Cost:
        """Concurrent sends of nbytes each, (src, dst) pairs; the slowest sets the time (the sender
        whose NIC is shared by the most crossing senders: time grows with the share)."""
        pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
        src, dst = pairs[:, 0], pairs[:, 1]
        moving = src != dst
        if not moving.any() or nbytes <= 0:
            return Cost(0.0)
        src, dst = src[moving], dst[moving]
        per = self.ranks_per_node
        crossing = src // per != dst // per
        if crossing.any():
            share = np.bincount(self._nic_ids[src[crossing]]).max()
            t_inter = self.cluster.inter.seconds(nbytes, int(share))
            t_intra = self.cluster.intra.seconds(nbytes) if not crossing.all() else 0.0
            return Cost(max(t_inter, t_intra), 0, nbytes)
        return Cost(self.cluster.intra.seconds(nbytes), nbytes, 0)

    def collective(self, groups: Sequence[Sequence[int]], nbytes: int) -> Cost:
        """All groups at once (disjoint, of one size), each rank sending nbytes spread evenly over
        its group's other members (all-to-all, all-gather, reduce-scatter alike): per rank, the
        intra share over NVLink and the inter share over its NIC (shared by its NIC's other
        senders), both at once; every peer posted at once: one latency per link class."""
        g = np.asarray(groups, dtype=np.int64)
        if nbytes <= 0 or g.ndim != 2 or g.shape[1] < 2:
            return Cost(0.0)
        m = g.shape[1]
        ranks = g.ravel()
        # members of one's group on one's own node: count (group, node) pairs
        nodes = self.world // self.ranks_per_node + 1
        where = np.repeat(np.arange(len(g)), m) * nodes + ranks // self.ranks_per_node
        same = np.bincount(where)[where]
        inter = nbytes * (m - same) / (m - 1)
        intra = nbytes - inter
        sending = inter > 0
        c = self.cluster
        worst = c.intra.seconds(float(intra.max()))
        if sending.any():
            nic = self._nic_ids[ranks]
            share = np.bincount(nic[sending], minlength=nic.max() + 1)[nic]
            load = np.where(sending, inter * share, 0.0)  # Link.seconds grows with bytes x share
            r = int(load.argmax())
            worst = max(worst, c.inter.seconds(float(inter[r]), int(share[r])))
        busiest = int(np.lexsort((ranks, inter))[-1])  # most inter-node bytes, then highest rank
        return Cost(worst, round(float(intra[busiest])), round(float(inter[busiest])))
