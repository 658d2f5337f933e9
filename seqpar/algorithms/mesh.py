"""One rank grid -> a trial's sequence-parallel mesh: named axes as real process groups.

A `Grid` is the rank grid of picotron / torchtitan: `arange(size).view(*sizes)` with a name per dim,
slowest first. An *axis* names one dim, or several dims together (usp's context-parallel ring `cp`
is `outer` x `inner`; `sp` is every dim). The group of an axis through a position is the positions
that differ from it only along the axis's dims, ordered by their coordinates on those dims, so a
rank's group rank is its coordinate. Every algorithm states its grid (`Algorithm.grid`):

    ring, ulysses, allgather    ("sp", P)
    usp head-first              ("outer", P/dhp/w) ("inner", w) ("hp", dhp)      cp = outer x inner
    usp context-first           ("hp", dhp) ("outer", dcp/w) ("inner", w)
    double_ring                 usp with dhp = 1
    burst                       ("outer", nodes) ("inner", ranks per node)     an inner ring a node
    wallfacer collective-intra  ("group", C) ("subring", P/C²) ("team", C)     a team per node block
    wallfacer p2p-intra         ("group", C) ("team", C) ("subring", P/C²)     a sub-ring per block

A `Mesh` is that grid laid on the ranks of a process group, with one `Comm` per axis this rank needs.
`build_mesh` creates the axes' process groups with `dist.new_group`, on every rank of the world, in
one fixed order (axes in the order given, groups in grid order), so each axis gets its own
communicator: native sub-group collectives, and on NCCL the outer ring's prefetch runs on another
communicator (another stream) than the inner ring. Where that cannot be done — a group that is not
the whole world, whose other ranks do not take part — the axes are point-to-point *views* of the
group (`comm.SubComm`), booked in the ledger as `axis(view)`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from seqpar.algorithms.comm import Comm, Links, StrictOrder, SubComm
from seqpar.errors import require
from seqpar.rules.grids import DP, SP, Grid
from seqpar.rules.groups import edp_groups, ep_groups, ep_index


@dataclass
class Mesh:
    """A grid laid on `ranks` (global rank of each grid position): this rank's Comm per axis."""

    grid: Grid
    ranks: tuple[int, ...]
    pos: int
    nodes: tuple[int, ...] | None = None  # node id of each grid position (None: one node)
    comms: dict[str, Comm] = field(default_factory=dict)
    real: bool = True  # axes are process groups of their own (False: views of one group)
    whole: dist.ProcessGroup | None = None  # the group of every rank of the mesh (DP x SP)

    @property
    def size(self) -> int:
        """Ranks in the whole mesh (DP x SP)."""
        return self.grid.size

    def with_links(self, links: Links | None) -> Mesh:
        """The same mesh (the same groups) with every axis emulating `links` (None: none)."""
        return dataclasses.replace(self, comms={a: c.with_links(links) for a, c in self.comms.items()})

    def comm(self, axis: str) -> Comm:
        require(axis in self.comms, "mesh axis", axis,
                f"this mesh was built with axes {', '.join(self.comms)}")
        return self.comms[axis]

    def coord(self, axis: str) -> int:
        return self.grid.coord(axis, self.pos)

    def device_mesh(self, device_type: str):
        """A `torch.distributed.device_mesh.DeviceMesh` view of this mesh with the same groups:
        dims ("dp", "sp") (or ("sp",) without DP), "sp" being every sequence-parallel dim together,
        so FSDP2, DTensor and a user's own torch code run on the communicators the attention uses."""
        from torch.distributed.device_mesh import DeviceMesh

        require(self.real, "mesh", "views", "a DeviceMesh needs real process groups (build_mesh)")
        names = tuple(n for n in (DP, SP) if n in self.comms and self.comms[n].group is not None)
        require(bool(names), "mesh", self.grid.size, "a one-rank mesh has no DeviceMesh view")
        groups = [self.comms[n].group for n in names]
        shape = [self.grid.axis_size(n) for n in names]
        cube = torch.tensor(self.ranks).view(*shape)
        if len(names) == 1:
            return DeviceMesh.from_group(groups[0], device_type, mesh=cube, mesh_dim_names=names)
        return DeviceMesh.from_group(groups, device_type, mesh=cube, mesh_dim_names=names)

    def shard_mesh(self, device_type: str):
        """The 1-D DeviceMesh over every rank of the mesh ("dp_sp"), on the mesh's whole group: what
        FSDP2 shards model states over (torchtitan's dp_shard x cp), no new communicator."""
        from torch.distributed.device_mesh import DeviceMesh

        require(self.real and self.whole is not None, "mesh", "views",
                "sharding needs the mesh's own process groups (build_mesh)")
        return DeviceMesh.from_group(self.whole, device_type, mesh=torch.tensor(self.ranks),
                                     mesh_dim_names=("dp_sp",))


def _check_nodes(nodes: Sequence[int] | None, size: int) -> tuple[int, ...] | None:
    if nodes is None:
        return None
    require(len(nodes) == size, "nodes", list(nodes), f"must give one node id per rank ({size})")
    return tuple(int(n) for n in nodes)


def build_mesh(grid: Grid, axes: Sequence[str], *, members: Sequence[int] | None = None,
               nodes: Sequence[int] | None = None, links: Links | None = None,
               strict: bool | None = None) -> Mesh | None:
    """The mesh of `grid` on the global ranks `members` (default: the whole world), with a process
    group per axis, its Comms emulating `links` and, `strict`, following NCCL's semantics (None:
    SEQPAR_STRICT_COMM). Collective: every rank of the world calls it with the same arguments;
    ranks outside `members` take part in group creation and get None.
    """
    order = StrictOrder.of(strict)
    world, me = dist.get_world_size(), dist.get_rank()
    members = tuple(range(world)) if members is None else tuple(members)
    require(len(members) == grid.size, "members", list(members),
            f"must hold one rank per grid position ({grid.size})")
    require(list(members) == sorted(set(members)), "members", list(members),
            "must be distinct ranks in ascending order (group rank = grid coordinate)")
    node_tuple = _check_nodes(nodes, grid.size)
    node_of = dict(zip(members, node_tuple, strict=True)) if node_tuple is not None else None
    whole = len(members) == world
    base_pg = dist.group.WORLD if whole else dist.new_group(list(members))
    comms: dict[str, Comm] = {}
    made: dict[tuple[int, ...], dist.ProcessGroup] = {}  # axes with the same ranks share a group
    for axis in (SP, *(a for a in axes if a != SP and grid.has(a))):
        for group in grid.groups(axis):
            ranks = [members[p] for p in group]
            if len(ranks) == grid.size:
                pg = base_pg
            elif len(ranks) == 1:
                pg = None
            elif tuple(ranks) in made:
                pg = made[tuple(ranks)]
            else:
                pg = made[tuple(ranks)] = dist.new_group(ranks)  # every rank, one order
            if me in ranks:
                comms[axis] = (Comm(pg, axis, node_of=node_of, links=links, order=order)
                               if pg is not None else Comm.solo(axis, me, node_of, links, order))
    if me not in members:
        return None
    return Mesh(grid, members, members.index(me), node_tuple, comms, real=True, whole=base_pg)


def solo_mesh(global_rank: int | None = None) -> Mesh:
    """The mesh of one rank alone (a dynamic step's group of one): every operation local, inside
    an initialised world or not."""
    me = global_rank if global_rank is not None else (
        dist.get_rank() if dist.is_available() and dist.is_initialized() else 0)
    return Mesh(Grid.line(1), (me,), 0, None, {SP: Comm.solo(SP, me)}, real=True, whole=None)


def view_mesh(grid: Grid, axes: Sequence[str], base: Comm,
              nodes: Sequence[int] | None = None) -> Mesh:
    """The mesh of `grid` on the ranks of `base` (grid position = group rank), each axis a
    point-to-point view of `base`: nothing is created, only `base`'s members take part."""
    require(base.size == grid.size, "group size", base.size,
            f"must equal the grid's size ({grid.size})")
    node_tuple = _check_nodes(nodes, grid.size)
    if node_tuple is not None:
        base = base.with_nodes(dict(zip(base.global_ranks, node_tuple, strict=True)))
    comms: dict[str, Comm] = {}
    for axis in (SP, *(a for a in axes if a != SP and grid.has(a))):
        group = grid.group_of(axis, base.rank)
        if len(group) == grid.size:
            comms[axis] = base.relabel(axis)
        elif len(group) == 1:
            comms[axis] = Comm.solo(axis, base.global_ranks[base.rank], base.node_of, base.links,
                                    base.order)
        else:
            comms[axis] = SubComm(base, group, f"{axis}(view)")
    return Mesh(grid, tuple(base.global_ranks), base.rank, node_tuple, comms, real=False)


@dataclass
class Pool:
    """The process groups of a dynamic step: every group of the pool, made once (`build_pool`).
    `meshes` maps each group this rank is in (pool ranks) to its mesh; `whole` is the pool's own
    group (gradients are reduced over it once a step)."""

    members: tuple[int, ...]                      # global rank of each pool rank
    pos: int                                      # this rank's pool rank
    meshes: dict[tuple[int, ...], Mesh] = field(default_factory=dict)
    whole: dist.ProcessGroup | None = None        # None: a pool of one

    @property
    def size(self) -> int:
        return len(self.members)

    def groups(self) -> list[dist.ProcessGroup]:
        """Every process group this pool made (to destroy it)."""
        made = {id(c.group): c.group for m in self.meshes.values() for c in m.comms.values()
                if c.group is not None}
        made.update({id(m.whole): m.whole for m in self.meshes.values() if m.whole is not None})
        if self.whole is not None:
            made[id(self.whole)] = self.whole
        made.pop(id(dist.group.WORLD), None)
        return list(made.values())


def build_pool(groups: Sequence[tuple[tuple[int, ...], Grid, Sequence[str]]], *,
               members: Sequence[int] | None = None, nodes: Sequence[int] | None = None,
               links: Links | None = None, strict: bool | None = None,
               whole: dist.ProcessGroup | None = None) -> Pool | None:
    """The pool's groups — each (pool ranks, grid, axes), the grid laid on those ranks — built
    collectively on every rank of the world, in the order given (the same on every rank: the
    groups of one size after another), so that every group is created once per trial and never
    during a step. Groups of one rank need no process group and are left out. `members`: the
    pool's global ranks (default the world); `nodes`: each pool rank's node. Ranks outside the
    pool take part in the creation and get None. `whole`: the pool's own group, made before
    (default: made here)."""
    world, me = dist.get_world_size(), dist.get_rank()
    members = tuple(range(world)) if members is None else tuple(members)
    node_tuple = _check_nodes(nodes, len(members))
    if whole is None:
        whole = (dist.group.WORLD if len(members) == world
                 else dist.new_group(list(members)) if len(members) > 1 else None)
    meshes: dict[tuple[int, ...], Mesh] = {}
    for ranks, grid, axes in groups:
        if len(ranks) == 1:
            continue
        mesh = build_mesh(grid, axes, members=[members[r] for r in ranks],
                          nodes=None if node_tuple is None else [node_tuple[r] for r in ranks],
                          links=links, strict=strict)
        if mesh is not None:
            meshes[tuple(ranks)] = mesh
    if me not in members:
        return None
    return Pool(members, members.index(me), meshes, whole if len(members) > 1 else None)


@dataclass
class ExpertGroups:
    """This rank's expert-parallel groups (`rules.groups`: EP groups of `ep` consecutive ranks of
    the DP x SP world): `comm`, its EP group (booked as `ep`: the dispatch and combine
    all-to-alls), and `edp`, the ranks holding the same experts (None: just this one)."""

    ep: int
    index: int                              # EP rank: this rank holds experts [index*E/ep, ...)
    comm: Comm
    edp: dist.ProcessGroup | None
    edp_size: int
    edp_rank: int

    def experts(self, total: int) -> tuple[int, int]:
        """The experts [start, stop) of `total` this rank's EP index holds."""
        per = total // self.ep
        return self.index * per, (self.index + 1) * per


def build_expert_groups(ep: int, *, members: Sequence[int] | None = None,
                        nodes: Sequence[int] | None = None, links: Links | None = None,
                        make: Callable[[list[int]], dist.ProcessGroup] | None = None
                        ) -> ExpertGroups | None:
    """The EP and EDP groups of `ep` over the global ranks `members` (default: the world; each
    one's node in `nodes`), created on every rank of the world in one order (EP groups, then EDP
    groups); ranks outside `members` take part and get None. `make` makes a group of ranks
    (default `dist.new_group`; a long-lived gang's tests keep theirs)."""
    world, me = dist.get_world_size(), dist.get_rank()
    members = tuple(range(world)) if members is None else tuple(members)
    node_tuple = _check_nodes(nodes, len(members))
    node_of = dict(zip(members, node_tuple, strict=True)) if node_tuple is not None else None
    mine: dict[str, dist.ProcessGroup | None] = {}
    for kind, groups in (("ep", ep_groups(len(members), ep)),
                         ("edp", edp_groups(len(members), ep))):
        for group in groups:
            ranks = [members[r] for r in group]
            pg = (dist.group.WORLD if len(ranks) == world else None if len(ranks) == 1
                  else (make or dist.new_group)(ranks))
            if me in ranks:
                mine[kind] = pg
    if me not in members:
        return None
    index, group = ep_index(members.index(me), ep)
    comm = (Comm(mine["ep"], "ep", node_of=node_of, links=links) if mine["ep"] is not None
            else Comm.solo("ep", me, node_of, links))
    edp = mine["edp"]
    return ExpertGroups(ep, index, comm, edp, len(members) // ep, group)

