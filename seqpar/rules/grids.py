"""One rank grid per algorithm: the single source of every process group it needs, no torch.

A `Grid` is the rank grid of picotron / torchtitan: `arange(size).reshape(*sizes)` with a name per
dim, slowest first. An *axis* names one dim, or several dims together (usp's context-parallel ring
`cp` is `outer` x `inner`; `sp` is every dim but `dp`). The group of an axis through a position is the
positions that differ from it only along the axis's dims, ordered by their coordinates on those dims,
so a rank's group rank is its coordinate. `seqpar.algorithms.mesh` lays a grid on process groups.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from seqpar.errors import require

SP = "sp"  # the axis of every dim but "dp": the whole sequence-parallel group
DP = "dp"   # the data-parallel dim, slowest, when a mesh has one (Grid.with_dp)


@dataclass(frozen=True)
class Grid:
    """A rank grid: named dims, slowest first, and named axes made of several dims."""

    dims: tuple[tuple[str, int], ...]
    axes: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def __post_init__(self) -> None:
        names = [n for n, _ in self.dims]
        require(len(set(names)) == len(names), "grid", names, "dim names must be distinct")
        for name, size in self.dims:
            require(isinstance(size, int) and size >= 1, f"grid.{name}", size,
                    "must be a positive integer")
        for axis, over in self.axes:
            require(set(over) <= set(names), f"grid.{axis}", over, f"must name dims of {names}")

    @classmethod
    def line(cls, size: int) -> Grid:
        """One dim: every rank in one group (ring, ulysses, allgather)."""
        return cls(((SP, size),))

    @property
    def size(self) -> int:
        out = 1
        for _, n in self.dims:
            out *= n
        return out

    def with_dp(self, dp: int) -> Grid:
        """This grid replicated `dp` times along a slowest data-parallel dim: DP x SP."""
        return Grid(((DP, dp), *self.dims), self.axes)

    def sp_dims(self) -> tuple[tuple[str, int], ...]:
        """The sequence-parallel dims: all but "dp"."""
        return tuple(d for d in self.dims if d[0] != DP)

    def over(self, axis: str) -> tuple[str, ...]:
        """The dims an axis spans, in grid order."""
        if axis == SP:
            return tuple(n for n, _ in self.sp_dims())
        if any(n == axis for n, _ in self.dims):
            return (axis,)
        for name, over in self.axes:
            if name == axis:
                order = [n for n, _ in self.dims]
                return tuple(sorted(over, key=order.index))
        raise KeyError(f"grid has no axis {axis!r}")

    def has(self, axis: str) -> bool:
        return axis == SP or any(n == axis for n, _ in self.dims) or any(
            n == axis for n, _ in self.axes)

    def axis_size(self, axis: str) -> int:
        sizes = dict(self.dims)
        out = 1
        for n in self.over(axis):
            out *= sizes[n]
        return out

    def groups(self, axis: str) -> tuple[tuple[int, ...], ...]:
        """Every group of the axis (positions, by coordinate), in grid order of the other dims."""
        return _groups(self, axis)

    def group_of(self, axis: str, pos: int) -> tuple[int, ...]:
        return next(g for g in self.groups(axis) if pos in g)

    def coord(self, axis: str, pos: int) -> int:
        """pos's coordinate on the axis: its rank in the axis's group."""
        return self.group_of(axis, pos).index(pos)


@lru_cache(maxsize=256)
def _groups(grid: Grid, axis: str) -> tuple[tuple[int, ...], ...]:
    names = [n for n, _ in grid.dims]
    over = grid.over(axis)
    cube = np.arange(grid.size).reshape(*[n for _, n in grid.dims])
    rest = [names.index(n) for n in names if n not in over]
    moved = cube.transpose(*rest, *[names.index(n) for n in over])
    rows = moved.reshape(-1, grid.axis_size(axis))
    return tuple(tuple(int(p) for p in row) for row in rows)


def ranks_per_node_of(world: int, nodes: int, ranks_per_node: int | None) -> int:
    """The ranks per node of `world` ranks over `nodes` nodes (default world / nodes): the one rule
    "nodes x ranks per node = world". Raises ConfigError."""
    require(isinstance(nodes, int) and nodes >= 1, "nodes", nodes, "must be a positive integer")
    if ranks_per_node is None:
        require(world % nodes == 0, "nodes", nodes, f"must divide the world size ({world})")
        return world // nodes
    require(isinstance(ranks_per_node, int) and ranks_per_node >= 1, "ranks_per_node",
            ranks_per_node, "must be a positive integer")
    require(nodes * ranks_per_node == world, "ranks_per_node", ranks_per_node,
            f"nodes ({nodes}) x ranks_per_node must equal the world size ({world})")
    return ranks_per_node
