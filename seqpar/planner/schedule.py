"""Each algorithm's schedule: its stages per phase, with the bytes taken from the algorithm's own
analytic functions (the numbers the ledger is checked against) and the structure added here.

A stage is a collective (not overlapped with compute), a set of concurrent point-to-point sends (not
overlapped), a kernel (compute only), or a ring: steps of compute, each overlapped with the transfer
that brings the next block (and, backward, the gradient that follows one step behind), with inner
rings and an outer prefetch that overlaps a whole inner ring (LoongTrain Alg. 2, BurstAttention's
topology-aware ring). `phase_bytes` sums a schedule's bytes per phase: it equals
`algorithms.expected_bytes` for every algorithm (tests/unit/test_perf_model.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache, lru_cache
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np

from seqpar.rules import algorithms, groups
from seqpar.rules.algorithms import burst, usp
from seqpar.rules.flops import BACKWARD_FLOPS as BACKWARD
from seqpar.rules.groups import NestedRing, WallFacerGrid
from seqpar.rules.shape import AttnShape

Members = tuple[int, ...]


@dataclass(frozen=True)
class Collective:
    label: str
    groups: list[list[int]]
    nbytes: int  # the busiest rank's bytes


@dataclass(frozen=True)
class P2P:
    label: str
    pairs: list[tuple[int, int]]
    nbytes: int


@dataclass(frozen=True)
class Kernel:
    label: str
    q_members: Members
    k_members: Members
    heads: int
    factor: float = 1.0  # 1 forward, kernel.BACKWARD backward


@dataclass(frozen=True)
class RingStage:
    """Rings of equal structure running at once; blocks(ring, pos, src) -> (q_members, k_members):
    whose queries meet whose keys when ring position `pos` holds the block that started at `src`."""

    label: str
    rings: list[list[int]]
    inner: int
    msg: int
    grad: int
    heads: int
    blocks: Callable[[int, int, int], tuple[Members, Members]]
    factor: float = 1.0
    same_blocks: bool = True  # every ring meets the same blocks (blocks ignores its ring argument)
    # what a block depends on (perf.ring): blocks(r, pos, src) is one block for every (r, pos, src)
    # whose keys compare alike, part by part (keys[0][r, pos] against keys[1][r, src]: arrays of
    # rings x positions x parts); None: the positions themselves (a block depends only on whether
    # src is before, at or after pos: true of every layout's shards, and of unions of ranks that
    # are translates of each other)
    keys: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def size(self) -> int:
        return len(self.rings[0])

    @property
    def nbytes(self) -> int:
        n = self.size
        return 0 if n == 1 else (n - 1) * self.msg + n * self.grad

    def source(self, pos: int, outer_step: int, inner_step: int) -> int:
        return NestedRing(self.size, self.inner, pos).source(outer_step, inner_step)


Stage = Collective | P2P | Kernel | RingStage


@dataclass
class Schedule:
    phases: dict[str, list[Stage]] = field(default_factory=lambda: {"forward": [], "backward": []})


def phase_bytes(s: Schedule) -> dict[str, int]:
    return {ph: sum(getattr(st, "nbytes", 0) for st in stages) for ph, stages in s.phases.items()}


def _per_msg(total: int, count: int) -> int:
    return total // count if count else 0


def _parsed(name: str, options: Mapping[str, Any]) -> Any:
    """The algorithm's Options object for these options (gradient dtype and the like)."""
    return algorithms.get(name).parse(dict(options))



def all_ranks(world: int) -> tuple[int, ...]:
    return tuple(range(world))


@lru_cache(maxsize=64)
def _whole(world: int) -> list[list[int]]:
    """All ranks as one group (one ring), one object a world for every schedule: what the links
    derive from a group is memoised by the group object (`net.ByIdentity`)."""
    return [list(range(world))]


def _ring(shape: AttnShape, world: int, options: Mapping[str, Any], nodes: int) -> Schedule:
    b = algorithms.expected_bytes("ring", shape, world, **options)
    msg = _per_msg(b["forward"], world - 1)
    grad = _per_msg(b["backward"] - (world - 1) * msg, world)
    ring = _whole(world)

    def blocks(_r: int, pos: int, src: int) -> tuple[Members, Members]:
        return (pos,), (src,)

    s = Schedule()
    s.phases["forward"].append(RingStage("ring", ring, world, msg, 0, shape.heads, blocks))
    s.phases["backward"].append(RingStage("ring", ring, world, msg, grad, shape.heads, blocks, BACKWARD))
    return s


def _burst(shape: AttnShape, world: int, options: Mapping[str, Any], nodes: int) -> Schedule:
    per_node = options.get("ranks_per_node") or max(1, world // nodes)
    inner = groups.node_block_size([r // per_node for r in range(world)])
    b = algorithms.expected_bytes("burst", shape, world, **options)
    msg = _per_msg(b["forward"], world - 1)
    q_block, dq = burst.query_block_bytes(shape, world, options=_parsed("burst", options))
    ring = _whole(world)
    s = Schedule()
    s.phases["forward"].append(RingStage("burst ring", ring, inner, msg, 0, shape.heads,
                                    lambda _r, pos, src: ((pos,), (src,))))
    s.phases["backward"].append(RingStage("query ring", ring, inner, q_block, dq, shape.heads,
                                     lambda _r, pos, src: ((src,), (pos,)), BACKWARD))
    return s


def _usp(shape: AttnShape, world: int, options: Mapping[str, Any], nodes: int) -> Schedule:
    dhp, dcp, placement, inner = usp.grid_of(world, options)
    ops = usp.bytes_by_op(shape, world, options)
    hp, cp, union = _usp_groups(dhp, dcp, placement)
    msg = _per_msg(ops["forward"]["p2p"], dcp - 1)
    grad = _per_msg(ops["backward"]["p2p"] - (dcp - 1) * msg, dcp)
    heads = shape.heads // dhp

    def blocks(_r: int, pos: int, src: int) -> tuple[Members, Members]:
        return union[pos], union[src]

    s = Schedule()
    for phase, factor, g in (("forward", 1.0, 0), ("backward", BACKWARD, grad)):
        a2a = ops[phase]["all_to_all"]
        s.phases[phase] += [Collective("seq all-to-all", hp, a2a // 2),
                            RingStage("cp ring", cp, inner, msg, g, heads, blocks, factor),
                            Collective("seq all-to-all", hp, a2a - a2a // 2)]
    return s


@lru_cache(maxsize=64)
def _usp_groups(dhp: int, dcp: int, placement: str) -> tuple[list, list, list[Members]]:
    """(HP groups, CP rings, the ranks whose tokens CP position b holds: HP group b), shared by
    every inner ring and shape."""
    hp = groups.usp_hp_groups(dhp, dcp, placement)
    return hp, groups.usp_cp_groups(dhp, dcp, placement), [tuple(m) for m in hp]


def _ulysses(shape: AttnShape, world: int, options: Mapping[str, Any], nodes: int) -> Schedule:
    b = algorithms.expected_bytes("ulysses", shape, world, **options)
    group = _whole(world)
    s = Schedule()
    for phase, factor in (("forward", 1.0), ("backward", BACKWARD)):
        s.phases[phase] += [Collective("all-to-all", group, b[phase] // 2),
                            Kernel("attention", all_ranks(world), all_ranks(world),
                                   shape.heads // world, factor),
                            Collective("all-to-all", group, b[phase] - b[phase] // 2)]
    return s


def _allgather(shape: AttnShape, world: int, options: Mapping[str, Any], nodes: int) -> Schedule:
    b = algorithms.expected_bytes("allgather", shape, world, **options)
    group = _whole(world)
    s = Schedule()
    s.phases["forward"] += [Collective("all-gather K,V", group, b["forward"]),
                            Kernel("attention", (world - 1,), all_ranks(world), shape.heads)]
    s.phases["backward"] += [Kernel("attention", (world - 1,), all_ranks(world), shape.heads, BACKWARD),
                             Collective("reduce-scatter dK,dV", group, b["backward"])]
    return s


def _local(shape: AttnShape, world: int, options: Mapping[str, Any], nodes: int) -> Schedule:
    s = Schedule()
    s.phases["forward"].append(Kernel("attention", (0,), (0,), shape.heads))
    s.phases["backward"].append(Kernel("attention", (0,), (0,), shape.heads, BACKWARD))
    return s


class _Teams(NamedTuple):
    """A WallFacer grid's ranks, whatever the shape (built once per grid: every shape and phase of
    it shares these objects, and what the links derive from them, `net.ByIdentity`)."""

    grid: WallFacerGrid
    team_groups: list[list[int]]  # each team's ranks, by member
    rings: list[list[int]]        # each sub-ring's ranks, in ring order
    pairs: list[tuple[int, int]]  # (rank, where its block goes) of the initial placement
    busiest: int                  # the first rank whose block moves (0: none moves)
    placing: bool                 # whether any block moves
    team: np.ndarray              # (ranks, C): each rank's team
    held: np.ndarray              # (ranks, C): the team whose K,V each rank holds once placed
    keys: tuple[np.ndarray, np.ndarray] | None       # the sub-rings' keys (`RingStage.keys`)
    keys_back: tuple[np.ndarray, np.ndarray] | None  # and backward


@lru_cache(maxsize=64)
def _teams(world: int, team_size: int, placement: str) -> _Teams:
    grid = WallFacerGrid(world, team_size, placement)
    c, t = grid.team_size, grid.ring_size
    # WallFacerGrid's maps are arithmetic: they take every rank at once as an array
    every = np.arange(world)
    sends = grid.init_send(every)
    placing = every[sends != every].tolist()
    members = np.stack(grid.members(np.arange(world // c)), axis=1)
    starts = grid.rank(np.array([g * t * c + a for g in range(c) for a in range(c)]))
    # each start's sub-ring (`WallFacerGrid.subring`), every position of every sub-ring at once
    team, member = grid.coords(starts)
    ring_ranks = grid.rank((team - team % t + np.arange(t)[:, None]).T * c + member[:, None])
    # a team is (team group, index in it): two teams' ranks interleave by how those compare
    q_keys, k_keys = (np.stack(divmod(team, t), axis=-1) for team in
                      (grid.coords(ring_ranks)[0], grid.block_team(ring_ranks)))
    ordered = np.stack(np.broadcast_arrays(0, np.arange(t)), axis=-1)
    one_ring = (q_keys == k_keys).all() and (q_keys == ordered).all()  # one team a rank: a ring
    keys = None if one_ring else (q_keys, k_keys)
    return _Teams(grid, members.tolist(), ring_ranks.tolist(),
                  list(zip(every.tolist(), sends.tolist(), strict=True)),
                  placing[0] if placing else 0, bool(placing), members[grid.coords(every)[0]],
                  members[grid.block_team(every)], keys, keys and keys[::-1])


def _wallfacer(shape: AttnShape, world: int, options: Mapping[str, Any], nodes: int) -> Schedule:
    teams = _teams(world, options.get("team_size", 1), options.get("placement", "collective-intra"))
    c, t = teams.grid.team_size, teams.grid.ring_size
    rb = algorithms.get("wallfacer").bytes_of_rank(shape, world, options, teams.busiest)
    ring_fwd = algorithms.expected_bytes("ring", shape, world // c, **{})["forward"]
    block = _per_msg(ring_fwd, world // c - 1)  # a team's K,V: the ring message of P/C team-sized shards
    placed = block if teams.placing else 0
    q_block, dq = burst.query_block_bytes(shape, world, tokens_factor=c,
                                          options=_parsed("wallfacer", options))
    rings = teams.rings

    def fwd_blocks(r: int, pos: int, src: int) -> tuple[Members, Members]:
        ring = rings[r]
        return tuple(teams.team[ring[pos]].tolist()), tuple(teams.held[ring[src]].tolist())

    def bwd_blocks(r: int, pos: int, src: int) -> tuple[Members, Members]:
        ring = rings[r]
        return tuple(teams.team[ring[src]].tolist()), tuple(teams.held[ring[pos]].tolist())

    fwd_coll = rb["forward"] - placed - (t - 1) * block
    bwd_ring = burst.query_ring_bytes(q_block, dq, t)
    bwd_coll = rb["backward"] - bwd_ring - placed
    s = Schedule()
    s.phases["forward"] += [Collective("team all-gather q,k,v + combine", teams.team_groups,
                                       fwd_coll),
                            P2P("initial placement", teams.pairs, placed),
                            RingStage("sub-ring", rings, t, block, 0, shape.heads, fwd_blocks,
                                      same_blocks=False, keys=teams.keys)]
    s.phases["backward"] += [RingStage("query sub-ring", rings, t, q_block, dq, shape.heads,
                                       bwd_blocks, BACKWARD, same_blocks=False,
                                       keys=teams.keys_back),
                             P2P("placement back", teams.pairs, placed),
                             Collective("team all-gather dO,D,lse + reduce-scatter",
                                        teams.team_groups, bwd_coll)]
    return s


BUILDERS: dict[str, Callable[[AttnShape, int, Mapping[str, Any], int], Schedule]] = {
    "local": _local, "allgather": _allgather, "ulysses": _ulysses, "ring": _ring, "usp": _usp,
    "double_ring": _usp, "wallfacer": _wallfacer, "burst": _burst,
}


def schedule(name: str, shape: AttnShape, world: int, options: Mapping[str, Any],
             nodes: int = 1) -> Schedule:
    """The stages of `name` at this shape and world; options resolved by the algorithm (built once
    per configuration: a plan asks for it once per layout, and memory once more)."""
    try:
        key = (name, shape, world, tuple(sorted(options.items())), nodes)
        hash(key)
    except TypeError:
        return _build(name, shape, world, options, nodes)
    got = _BUILT.get(key)
    if got is None:
        if len(_BUILT) >= 512:
            _BUILT.clear()
        got = _BUILT[key] = _build(name, shape, world, options, nodes)
    return Schedule({ph: list(stages) for ph, stages in got.phases.items()})


_BUILT: dict[tuple, Schedule] = {}


@cache
def _defaults(name: str) -> Mapping[str, Any]:
    """`algorithms.options_of`, read once an algorithm (a plan builds hundreds of schedules)."""
    return MappingProxyType(dict(algorithms.options_of(name)))


def _build(name: str, shape: AttnShape, world: int, options: Mapping[str, Any],
           nodes: int) -> Schedule:
    resolved = {**_defaults(name), **options}  # the algorithm's defaults, then ours
    if name not in BUILDERS:  # a peer, or an algorithm that lands later: its bytes as one
        # collective, then the whole attention spread evenly over the ranks
        b = algorithms.expected_bytes(name, shape, world, **options)
        s = Schedule()
        for ph, factor in (("forward", 1.0), ("backward", BACKWARD)):
            s.phases[ph] += [Collective(name, _whole(world), b[ph]),
                             Kernel("attention", all_ranks(world), all_ranks(world), shape.heads,
                                    factor / world)]
        return s
    return BUILDERS[name](shape, world, resolved, nodes)
