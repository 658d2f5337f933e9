"""Rank maths: one rank grid -> every group an algorithm needs, and the process groups for them.

The pure functions here (no torch.distributed) say which ranks belong together for an algorithm and
a placement; the algorithm uses them to build its sub-groups, the platform uses them to decide which
ranks share a node, and the ledger's link classes follow from that. A sub-group is a view of its
parent group (comm.SubComm): nothing is created, so only its members take part (a P = 4 run inside a
world of 8 does not need the other 4 ranks).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch.distributed as dist

from seqpar.algorithms.comm import Comm, SubComm
from seqpar.errors import require

_cache: dict[tuple[int, ...], dist.ProcessGroup] = {}


def subgroup(parent: Comm, members: Sequence[int], label: str) -> Comm:
    """A Comm over `members` (ranks of the parent group, in ring/rank order) for this rank.

    Every member must call it with the same members; non-members must not.
    """
    global_ranks = tuple(parent.global_ranks[m] for m in members)
    if global_ranks == tuple(parent.global_ranks):
        return parent.relabel(label)
    if len(members) == 1:
        return Comm.solo(label, global_ranks[0])
    return SubComm(parent, members, label)  # why not dist.new_group: see SubComm


def destroy_cached_groups() -> None:
    """Forget (and destroy) the cached sub-groups, e.g. before the world group is destroyed."""
    for group in _cache.values():
        try:
            dist.destroy_process_group(group)
        except (RuntimeError, ValueError):
            pass
    _cache.clear()


# --- LoongTrain 2D (usp, double ring)
# A sequence-parallel group of P = dhp x dcp ranks is one grid: grid[a][b] is the rank at head-parallel
# coordinate a (which head slice it computes, i.e. which context-parallel group it is in) and
# context-parallel coordinate b (which head-parallel group it is in, i.e. which part of the sequence
# its context-parallel ring position holds). A column grid[.][b] is a head-parallel (HP) group, a row
# grid[a][.] a context-parallel (CP) group (LoongTrain §4.1). Placement decides which coordinate
# varies fastest over consecutive ranks, and nodes are blocks of consecutive ranks (§4.4, Fig. 11):
# head-first puts an HP group on consecutive ranks (rank = b * dhp + a), context-first a CP group
# (rank = a * dcp + b). Every group comes out sorted by rank, so a rank's position in a group (its
# torch.distributed group rank) is its coordinate.

PLACEMENTS = ("head-first", "context-first")


def usp_grid(dhp: int, dcp: int, placement: str) -> list[list[int]]:
    """grid[a][b]: the rank at head-parallel coordinate a < dhp and context coordinate b < dcp."""
    require(placement in PLACEMENTS, "placement", placement, f"must be one of {', '.join(PLACEMENTS)}")
    if placement == "head-first":
        return [[b * dhp + a for b in range(dcp)] for a in range(dhp)]
    return [[a * dcp + b for b in range(dcp)] for a in range(dhp)]


def usp_hp_groups(dhp: int, dcp: int, placement: str) -> list[list[int]]:
    """The dcp head-parallel groups (each of dhp ranks, all-to-all inside), by context coordinate."""
    grid = usp_grid(dhp, dcp, placement)
    return [[grid[a][b] for a in range(dhp)] for b in range(dcp)]


def usp_cp_groups(dhp: int, dcp: int, placement: str) -> list[list[int]]:
    """The dhp context-parallel groups (each a ring of dcp ranks), by head-parallel coordinate."""
    return usp_grid(dhp, dcp, placement)


def usp_coords(rank: int, dhp: int, dcp: int, placement: str) -> tuple[int, int]:
    """(a, b): the head-parallel and context-parallel coordinates of `rank`."""
    if placement == "head-first":
        return rank % dhp, rank // dhp
    return rank // dcp, rank % dcp


def usp_colocated(dhp: int, dcp: int, placement: str) -> list[list[int]]:
    """The groups a placement wants on one node: HP groups (head-first) or CP groups (context-first)."""
    if placement == "head-first":
        return usp_hp_groups(dhp, dcp, placement)
    return usp_cp_groups(dhp, dcp, placement)


def inner_rings(dcp: int, inner: int) -> list[list[int]]:
    """Positions of a CP ring of dcp split into dcp / inner inner rings of `inner` consecutive positions
    (LoongTrain §4.3; consecutive, so an inner ring of a node-local CP group stays on one node)."""
    return [list(range(i * inner, (i + 1) * inner)) for i in range(dcp // inner)]


def outer_rings(dcp: int, inner: int) -> list[list[int]]:
    """The outer rings: position t of every inner ring (concurrent inter-node P2P, one per NIC)."""
    return [list(range(t, dcp, inner)) for t in range(inner)]


@dataclass(frozen=True)
class DoubleRing:
    """Position `pos` of a ring of `size` split into inner rings of `inner` (Double-Ring-Attention).

    Position pos = i * inner + t is member t of inner ring i. At outer step o and inner step s it holds
    the K,V block that started at position (i - o, t - s) (indices modulo the ring sizes). With
    inner = size it is the plain ring: one outer step, source(0, s) = pos - s.
    """

    size: int
    inner: int
    pos: int

    @property
    def outer(self) -> int:
        """Outer steps (inner rings): size / inner."""
        return self.size // self.inner

    def _at(self, i: int, t: int) -> int:
        return (i % self.outer) * self.inner + t % self.inner

    def _it(self) -> tuple[int, int]:
        return divmod(self.pos, self.inner)

    def source(self, outer_step: int, inner_step: int) -> int:
        i, t = self._it()
        return self._at(i - outer_step, t - inner_step)

    @property
    def next_inner(self) -> int:
        i, t = self._it()
        return self._at(i, t + 1)

    @property
    def prev_inner(self) -> int:
        i, t = self._it()
        return self._at(i, t - 1)

    @property
    def next_outer(self) -> int:
        i, t = self._it()
        return self._at(i + 1, t)

    @property
    def prev_outer(self) -> int:
        i, t = self._it()
        return self._at(i - 1, t)

    def grad_peers(self, inner_step: int) -> tuple[int, int]:
        """(send to, receive from) for the dK,dV accumulator after `inner_step`.

        Inside an inner ring it travels with its K,V block. After the last inner step the block's
        next holder is the start of the next inner ring, one hop diagonally: position (i+1, t+1),
        which after the last outer step is the block's home. So dK,dV take `size` hops in all,
        exactly as in the plain ring (where the diagonal is just the next position).
        """
        if inner_step < self.inner - 1:
            return self.next_inner, self.prev_inner
        i, t = self._it()
        return self._at(i + 1, t + 1), self._at(i - 1, t - 1)
