"""Where ranks sit and what a transfer costs: intra-node links, NICs shared by several GPUs.

Ranks are dealt to nodes in blocks of consecutive ranks (rank r on node r // ranks_per_node, the
platform's and the papers' convention). A GPU's inter-node traffic leaves by its NIC
(`Cluster.nic_of`); when k concurrent senders use one NIC each gets 1/k of it (link contention).
Intra-node transfers use the GPU's own NVLink share (a switch: no contention).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import chain
from typing import Any, NamedTuple, TypeVar

import numpy as np

from seqpar.planner.clusters import Cluster

T = TypeVar("T")


class ByIdentity:
    """A memo keyed by an object's identity, for the rank lists a schedule reuses across the
    configurations a plan ranks (a list is not hashable, and hashing 1,024 ranks costs what the
    memo saves). An entry holds its object, so the id is not reused while the entry lives."""

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._held: dict[tuple, tuple[Any, Any]] = {}

    def get(self, obj: Any, make: Callable[[], T], *extra: Any) -> T:
        key = (id(obj), *extra)
        hit = self._held.get(key)
        if hit is not None and hit[0] is obj:
            return hit[1]
        if len(self._held) >= self.size:
            self._held.clear()
        value = make()
        self._held[key] = (obj, value)
        return value


class Hops(NamedTuple):
    """Concurrent sends as two arrays, senders and receivers (a ring's hops: `ring._hops`), for
    `Net.p2p` without pairing them up."""

    src: np.ndarray
    dst: np.ndarray


@dataclass(frozen=True)
class _Sends:
    """Where concurrent point-to-point sends go, whatever their size (`Net.p2p`)."""

    moving: bool
    crossing: bool  # some send leaves its node
    all_crossing: bool
    share: int  # the most crossing senders on one NIC


@dataclass(frozen=True)
class _Spread:
    """How a collective's bytes split between links, per rank, whatever their size: a rank sends
    `apart[r] / (m - 1)` of its bytes to group members on other nodes (`Net.collective`)."""

    m: int
    apart_min: int  # the fewest members elsewhere (the most intra-node bytes)
    nic_apart: int  # the rank whose NIC carries the most: its members elsewhere, its NIC's share
    nic_share: int
    busiest_apart: int  # the rank with the most inter-node bytes (then the highest rank)


@dataclass(frozen=True)
class Cost:
    """Seconds of a communication stage, the busiest rank's bytes by link class, and how long the
    stage keeps each link class busy (`intra_s`, `inter_s`: the busiest link of the class; what
    other traffic on those links, FSDP's in a training step, has to share)."""

    seconds: float
    intra: int = 0
    inter: int = 0
    intra_s: float = 0.0
    inter_s: float = 0.0

    @property
    def link(self) -> str:
        return "inter" if self.inter else "intra"

    def busy(self, link: str) -> float:
        return self.inter_s if link == "inter" else self.intra_s


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

    def p2p(self, pairs: Sequence[tuple[int, int]] | np.ndarray | Hops, nbytes: int) -> Cost:
        """Concurrent sends of nbytes each, (src, dst) pairs; the slowest sets the time (the sender
        whose NIC is shared by the most crossing senders: time grows with the share)."""
        sends = self._sends.get(pairs, lambda: self._sends_of(pairs))
        if not sends.moving or nbytes <= 0:
            return Cost(0.0)
        return self._cost(sends, nbytes, self._p2p_cost)

    def _cost(self, how: _Sends | _Spread, nbytes: float,
              make: Callable[[Any, float], Cost]) -> Cost:
        """`make(how, nbytes)`, memoised: a plan sends the same bytes the same way under every
        layout and phase (a Cost is frozen: shared; it keeps nbytes' type)."""
        key = (how, nbytes, type(nbytes))
        got = self._costs.get(key)
        if got is None:
            if len(self._costs) >= 4096:
                self._costs.clear()
            got = self._costs[key] = make(how, nbytes)
        return got

    @cached_property
    def _costs(self) -> dict[tuple, Cost]:
        return {}

    def _p2p_cost(self, sends: _Sends, nbytes: float) -> Cost:
        c = self.cluster
        if sends.crossing:
            t_inter = c.inter.seconds(nbytes, sends.share)
            t_intra = c.intra.seconds(nbytes) if not sends.all_crossing else 0.0
            return Cost(max(t_inter, t_intra), 0, nbytes, t_intra, t_inter)
        t = c.intra.seconds(nbytes)
        return Cost(t, nbytes, 0, t, 0.0)

    @cached_property
    def _sends(self) -> ByIdentity:
        return ByIdentity()

    @cached_property
    def memo(self) -> ByIdentity:
        """What a caller derives from these links and one of a schedule's objects, by the object
        (a ring stage's transfers: `ring._carry`; a plan times a stage under every layout)."""
        return ByIdentity()

    def _sends_of(self, pairs: Sequence[tuple[int, int]] | np.ndarray | Hops) -> _Sends:
        if isinstance(pairs, Hops):
            src, dst = pairs
        else:
            if isinstance(pairs, list) and pairs and isinstance(pairs[0], tuple):
                # a schedule's list of (src, dst): read flat, a few times faster than asarray's
                pairs = np.fromiter(chain.from_iterable(pairs), dtype=np.int64).reshape(-1, 2)
            else:
                pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
            src, dst = pairs[:, 0], pairs[:, 1]
        moving = src != dst
        if not moving.any():
            return _Sends(False, False, False, 0)
        src, dst = src[moving], dst[moving]
        per = self.ranks_per_node
        crossing = src // per != dst // per
        share = int(np.bincount(self._nic_ids[src[crossing]]).max()) if crossing.any() else 0
        return _Sends(True, bool(crossing.any()), bool(crossing.all()), share)

    def collective(self, groups: Sequence[Sequence[int]], nbytes: int) -> Cost:
        """All groups at once (disjoint, of one size), each rank sending nbytes spread evenly over
        its group's other members (all-to-all, all-gather, reduce-scatter alike): per rank, the
        intra share over NVLink and the inter share over its NIC (shared by its NIC's other
        senders), both at once; every peer posted at once: one latency per link class."""
        spread = self._spreads.get(groups, lambda: self._spread_of(groups))
        if nbytes <= 0 or spread is None:
            return Cost(0.0)
        return self._cost(spread, nbytes, self._collective_cost)

    def _collective_cost(self, spread: _Spread, nbytes: float) -> Cost:
        c, m = self.cluster, spread.m

        def inter(apart: int) -> float:
            return nbytes * apart / (m - 1)

        on_intra = c.intra.seconds(float(nbytes - inter(spread.apart_min)))
        on_inter = (c.inter.seconds(inter(spread.nic_apart), spread.nic_share)
                    if spread.nic_share else 0.0)
        busiest = inter(spread.busiest_apart)
        return Cost(max(on_intra, on_inter), round(nbytes - busiest), round(busiest), on_intra,
                    on_inter)

    @cached_property
    def _spreads(self) -> ByIdentity:
        return ByIdentity()

    def _spread_of(self, groups: Sequence[Sequence[int]]) -> _Spread | None:
        g = np.asarray(groups, dtype=np.int64)
        if g.ndim != 2 or g.shape[1] < 2:
            return None
        m = g.shape[1]
        ranks = g.ravel()
        # members of one's group on one's own node: count (group, node) pairs
        nodes = self.world // self.ranks_per_node + 1
        where = np.repeat(np.arange(len(g)), m) * nodes + ranks // self.ranks_per_node
        apart = m - np.bincount(where)[where]
        sending = apart > 0
        r = share = 0
        if sending.any():
            nic = self._nic_ids[ranks]
            shares = np.bincount(nic[sending], minlength=nic.max() + 1)[nic]
            r = int(np.where(sending, apart * shares, 0).argmax())  # bytes x share: the slowest
            share = int(shares[r])
        # the rank with the most inter-node bytes: its members elsewhere, the most of any rank's
        return _Spread(m, int(apart.min()), int(apart[r]), share, int(apart.max()))
