"""Rank maths: one rank grid -> every group an algorithm needs, and the process groups for them.

The pure functions here (no torch.distributed) say which ranks belong together for an algorithm and
a placement; the algorithm uses them to build its sub-groups, the platform uses them to decide which
ranks share a node, and the ledger's link classes follow from that. Sub-groups are created with local
synchronisation, so only the members of a group take part in creating it (a P = 4 run inside a world
of 8 does not need the other 4 ranks), and they are cached per set of global ranks.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch.distributed as dist

from seqpar.algorithms.comm import Comm

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
    group = _cache.get(global_ranks)
    if group is None:
        group = dist.new_group(list(global_ranks), use_local_synchronization=True)
        _cache[global_ranks] = group
    return Comm(group, label=label)


def destroy_cached_groups() -> None:
    """Forget (and destroy) the cached sub-groups, e.g. before the world group is destroyed."""
    for group in _cache.values():
        try:
            dist.destroy_process_group(group)
        except (RuntimeError, ValueError):
            pass
    _cache.clear()
