"""The pool of a dynamic step: its sequence-parallel group sizes, the groups of each size, and the
options an algorithm runs with at each size.

    pool_sizes(8)                       # (1, 2, 4, 8): Megatron-LM's power-of-two CP groups
    pool_sizes(3)                       # (1, 2, 3): the whole pool as the largest group
    pool_groups(8, 2)                   # ((0, 1), (2, 3), (4, 5), (6, 7)): aligned blocks
    pool_groups(8, 2, ranks_per_node=4) # the same blocks, never across a node
    options_at("usp", 2, {"dhp": 4}, heads=8, kv_heads=8)   # ("usp", {"dhp": 2, ...})

A group is a block of consecutive ranks aligned to its size (group k of size d holds ranks
[k·d, (k+1)·d)), inside a node where the group fits in one (ranks_per_node), so a small group's
traffic stays on the node's links. A group of one is `local`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from seqpar.errors import ConfigError, require
from seqpar.rules import algorithms
from seqpar.rules.options import Options
from seqpar.rules.shape import AttnShape

LOCAL = "local"
# `plan.algorithm: auto` (the dynamic policy): each group size runs the algorithm the planner
# predicts fastest there, chosen on the driver and carried in the trial
AUTO = "auto"


def pool_sizes(pool: int, any_size: bool = False) -> tuple[int, ...]:
    """The group sizes of a pool: powers of two below it and the pool itself (Megatron-LM's rule;
    ByteScale's any size from 1 to the pool with `any_size`)."""
    require(isinstance(pool, int) and pool >= 1, "pool", pool, "must be a positive integer")
    if any_size:
        return tuple(range(1, pool + 1))
    sizes = [1 << k for k in range(pool.bit_length()) if 1 << k < pool]
    return (*sizes, pool)


def pool_groups(pool: int, size: int, ranks_per_node: int | None = None
                ) -> tuple[tuple[int, ...], ...]:
    """The groups of `size` ranks: aligned blocks of consecutive ranks, each inside one node when
    `size` fits in a node (`ranks_per_node`; None: one node), else aligned across nodes."""
    require(1 <= size <= pool, "size", size, f"must be between 1 and the pool ({pool})")
    rpn = pool if ranks_per_node is None else ranks_per_node
    if size <= rpn:
        starts = [n * rpn + k * size for n in range(pool // rpn) for k in range(rpn // size)]
    else:
        starts = [k * size for k in range(pool // size)]
    return tuple(tuple(range(s, s + size)) for s in starts)


def smallest_size(length: int, capacity: int, sizes: tuple[int, ...]) -> int | None:
    """The smallest size d with d x capacity >= length (None: no group holds it)."""
    return next((d for d in sizes if d * capacity >= length), None)


def _valid(name: str, size: int, options: Mapping[str, Any], shape: AttnShape) -> bool:
    try:
        algorithms.check(name, shape, size, "contiguous", True, **options)
    except ConfigError:
        return False
    return True


def _distance(want: Mapping[str, Any], got: Mapping[str, Any]) -> tuple[int, float]:
    """How far `got` is from the options asked for: keys differing, then the sum of the numeric
    options' ratios (dhp 4 asked, 2 is nearer than 1)."""
    differ, ratio = 0, 0.0
    for key, value in want.items():
        have = got.get(key)
        if have == value:
            continue
        differ += 1
        if isinstance(value, int) and isinstance(have, int) and value > 0 and have > 0:
            ratio += max(value, have) / min(value, have)
    return differ, ratio


def options_at(name: str, size: int, requested: Mapping[str, Any], heads: int, kv_heads: int,
               head_dim: int = 8) -> tuple[str, dict[str, Any]]:
    """(algorithm, options) a group of `size` runs: `local` for one rank; the options asked for
    where they hold at this size; else the configuration of the algorithm's tuning space nearest
    to them (usp's dhp x dcp, the double ring's inner ring, WallFacer's team must divide the size).
    A size the algorithm cannot run at all raises ConfigError naming it."""
    if size == 1:
        return LOCAL, {k: v for k, v in requested.items() if k in Options.names()}
    shape = AttnShape(1, 16 * size, heads, kv_heads, head_dim, 2)
    if _valid(name, size, requested, shape):
        return name, dict(requested)
    common = {k: v for k, v in requested.items() if k in Options.names()}
    own = {k: v for k, v in requested.items() if k not in common}
    found = [o for o in algorithms.option_space(name, size)
             if _valid(name, size, {**o, **common}, shape)]
    if not found:
        raise ConfigError("sp_group", size, f"{name} cannot run on a group of {size} ranks with "
                          f"{heads} heads and {kv_heads} kv heads (a pool's groups are "
                          "its sizes: give a pool or heads it divides)")
    best = min(found, key=lambda o: _distance(own, o))
    return name, {**best, **common}
