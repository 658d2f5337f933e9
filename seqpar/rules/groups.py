"""Rank maths of the algorithms' schedules (pure functions, no torch.distributed): LoongTrain's 2D
groups and placements, the double ring's positions, WallFacer's Alg. 2 and 3, burst's node blocks.

The process groups themselves come from one rank grid per algorithm (`mesh.Grid`, built once per
trial by `mesh.build_mesh`); the functions here describe the same groups in the papers' coordinates,
and tests hold the two against each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from seqpar.errors import require

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
class NestedRing:
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


# --- WallFacer (teams, sub-rings)
# P ranks form P/C teams of C (WallFacer §4.2-4.3). Logical coordinates: team r_t < P/C and member
# r_a < C, logical rank L = r_t * C + r_a. The T = P/C² teams g*T .. g*T+T-1 form team group g, and
# member a of every team of group g is one member of sub-ring (g, a), a ring of T ranks. Alg. 2 and 3
# are written in these coordinates. Placement maps them to ranks (nodes are blocks of consecutive
# ranks): 'collective-intra' puts a team on consecutive ranks (rank = L, the case Alg. 2 describes),
# 'p2p-intra' puts a sub-ring on consecutive ranks (rank = (g*C + a)*T + j for team r_t = g*T + j).
# Both orders keep teams and sub-rings sorted by rank, so a rank's group rank is its coordinate.

WALLFACER_PLACEMENTS = ("p2p-intra", "collective-intra")


def get_init_send(r_t: int, r_a: int, d_t: int, d_a: int) -> int:
    """WallFacer Alg. 2: the logical rank that team r_t's member r_a sends the team's K,V to."""
    team_group_size = d_t // d_a
    target_team = r_a * team_group_size + r_t // d_a  # team group r_a, one team per sender team
    return target_team * d_a + r_t % d_a


def get_init_recv(r_t: int, r_a: int, d_t: int, d_a: int) -> int:
    """The inverse of Alg. 2: the logical rank whose team K,V (r_t, r_a) receives."""
    team_group_size = d_t // d_a
    src_member = r_t // team_group_size
    src_team = (r_t % team_group_size) * d_a + r_a
    return src_team * d_a + src_member


def get_p2p_config(r_t: int, r_a: int, d_t: int, d_a: int) -> tuple[int, int]:
    """WallFacer Alg. 3: logical (next, last) ranks in the sub-ring of (r_t, r_a)."""
    team_group_size = d_t // d_a
    group = r_t // team_group_size
    next_team = (r_t + 1) % team_group_size + team_group_size * group
    last_team = (r_t - 1) % team_group_size + team_group_size * group
    return r_a + next_team * d_a, r_a + last_team * d_a


def check_wallfacer(world: int, team_size: int, placement: str) -> None:
    require(isinstance(team_size, int) and 1 <= team_size and team_size ** 2 <= world,
            "team_size", team_size, f"must be an integer in [1, sqrt(P)] (P = {world})")
    require(world % team_size ** 2 == 0, "team_size", team_size,
            f"its square must divide the world size ({world})")
    require(placement in WALLFACER_PLACEMENTS, "placement", placement,
            f"must be one of {', '.join(WALLFACER_PLACEMENTS)}")


@dataclass(frozen=True)
class WallFacerGrid:
    """The teams and sub-rings of P = world ranks with teams of C = team_size, placed on ranks."""

    world: int
    team_size: int
    placement: str = "collective-intra"

    def __post_init__(self) -> None:
        check_wallfacer(self.world, self.team_size, self.placement)

    @property
    def teams(self) -> int:
        return self.world // self.team_size

    @property
    def ring_size(self) -> int:
        """T = P / C²: teams per team group, ranks per sub-ring, forward steps."""
        return self.world // self.team_size ** 2

    def rank(self, logical: int) -> int:
        if self.placement == "collective-intra":
            return logical
        r_t, a = divmod(logical, self.team_size)
        g, j = divmod(r_t, self.ring_size)
        return (g * self.team_size + a) * self.ring_size + j

    def logical(self, rank: int) -> int:
        if self.placement == "collective-intra":
            return rank
        ga, j = divmod(rank, self.ring_size)
        g, a = divmod(ga, self.team_size)
        return (g * self.ring_size + j) * self.team_size + a

    def coords(self, rank: int) -> tuple[int, int]:
        """(team, member) of a rank."""
        return divmod(self.logical(rank), self.team_size)

    def members(self, team: int) -> list[int]:
        """The ranks of a team, by member."""
        return [self.rank(team * self.team_size + a) for a in range(self.team_size)]

    def team(self, rank: int) -> list[int]:
        """The ranks of rank's team, by member."""
        return self.members(self.coords(rank)[0])

    def init_send(self, rank: int) -> int:
        return self.rank(get_init_send(*self.coords(rank), self.teams, self.team_size))

    def init_recv(self, rank: int) -> int:
        return self.rank(get_init_recv(*self.coords(rank), self.teams, self.team_size))

    def p2p(self, rank: int) -> tuple[int, int]:
        """(next, last) in rank's sub-ring (Alg. 3)."""
        nxt, last = get_p2p_config(*self.coords(rank), self.teams, self.team_size)
        return self.rank(nxt), self.rank(last)

    def subring(self, rank: int) -> list[int]:
        """The ranks of rank's sub-ring in ring order, starting at the team group's first team."""
        t, a = self.coords(rank)
        first = t - t % self.ring_size
        return [self.rank((first + j) * self.team_size + a) for j in range(self.ring_size)]

    def block_team(self, rank: int) -> int:
        """The team whose gathered K,V block `rank` holds after the initial placement."""
        return self.coords(self.init_recv(rank))[0]


# --- Burst (topology-aware ring)
# BurstAttention (BurstEngine §3.1, Fig. 4) splits the global ring into one sub-ring per node: blocks
# turn inside the node, and one inter-node step per node moves every rank's round-start block to the
# same position on the next node (all NICs at once). That is a NestedRing with inner = ranks per node.


def node_block_size(nodes: Sequence[int]) -> int:
    """Ranks per node when `nodes` (node id of each group member, in rank order) cuts the group into
    equal blocks of consecutive members, one node each; otherwise len(nodes) (one flat ring)."""
    world = len(nodes)
    size = next((i for i, n in enumerate(nodes) if n != nodes[0]), world)
    blocks = [nodes[i:i + size] for i in range(0, world, size)]
    even = world % size == 0 and all(len(set(b)) == 1 for b in blocks)
    distinct = len({b[0] for b in blocks}) == len(blocks)
    return size if even and distinct else world


def burst_ring(nodes: Sequence[int], rank: int) -> NestedRing:
    """The topology-aware ring of `rank` in a group whose members sit on `nodes`."""
    return NestedRing(len(nodes), node_block_size(nodes), rank)


# --- Expert parallelism (EP)
# EP borrows its ranks from the DP x SP world (torchtitan's EP inside dp_shard x cp; no rank is
# added for it): the world's ranks are dp-major (replica d holds ranks [d*sp, (d+1)*sp)), and an
# EP group is `ep` consecutive ranks of it — SP-inner first, so where ep <= sp an EP group sits
# inside one SP group, and where ep > sp it joins ep / sp whole SP groups of neighbouring replicas.
# Nodes are blocks of consecutive ranks, so an EP group lies inside one node whenever ep divides
# the ranks per node (ep <= ranks per node), and its all-to-alls then run on intra-node links. EP
# rank i of a group holds the experts [i*E/ep, (i+1)*E/ep) of every MoE layer (a contiguous slice
# of the stacked experts_* tensors). The ranks that hold the same experts — one of each EP group,
# the expert-data-parallel (EDP) group — sum those experts' gradients (and shard them under FSDP).
# The checkpoint modes the runner trains with EP: those that keep a rank's tokens whole.
EP_CHECKPOINTS = ("none", "full", "sc++")


def check_ep(ep: int, world: int, experts: int) -> None:
    """EP's own rules: a positive integer dividing the DP x SP world and the experts."""
    require(isinstance(ep, int) and not isinstance(ep, bool) and ep >= 1, "ep", ep,
            "must be a positive integer (ranks an MoE layer's experts are spread over)")
    require(world % ep == 0, "ep", ep, f"must divide the DP x SP ranks ({world})")
    require(experts % ep == 0, "ep", ep, f"must divide the experts of each MoE layer ({experts})")


def ep_groups(world: int, ep: int) -> list[list[int]]:
    """The world / ep EP groups: `ep` consecutive ranks each (group rank = EP index)."""
    return [list(range(g * ep, (g + 1) * ep)) for g in range(world // ep)]


def edp_groups(world: int, ep: int) -> list[list[int]]:
    """The ep expert-data-parallel groups: the ranks with EP index i (i, i + ep, ...), which hold
    the same experts; group rank = EP group index."""
    return [list(range(i, world, ep)) for i in range(ep)]


def ep_index(rank: int, ep: int) -> tuple[int, int]:
    """(the EP index, the EP group) of world rank `rank`: which experts it holds, whose tokens."""
    return rank % ep, rank // ep


def ep_within_nodes(ep: int, ranks_per_node: int) -> bool:
    """Whether every EP group lies inside one node (nodes are blocks of consecutive ranks)."""
    return ranks_per_node % ep == 0


def ep_rows(counts: Sequence[Sequence[int]], ep: int) -> list[tuple[int, int]]:
    """(rows sent, rows received) by each rank in one MoE layer's dispatch, from counts[r][e]:
    the assignments of rank r's tokens to expert e (a token sent to k experts counts k times).
    Rows bound for the rank's own EP index stay; the combine sends the same rows back, so a
    rank's all-to-all bytes a layer are (sent + received) x hidden x dtype bytes, each way
    (forward and backward: the backward sends the gradients of the same rows)."""
    experts = len(counts[0])
    per = experts // ep
    out = []
    for r, mine in enumerate(counts):
        i, g = ep_index(r, ep)
        group = range(g * ep, (g + 1) * ep)
        sent = sum(n for e, n in enumerate(mine) if e // per != i)
        got = sum(counts[q][e] for q in group if q != r for e in range(i * per, (i + 1) * per))
        out.append((sent, got))
    return out
