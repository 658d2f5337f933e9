"""The local gang keeps a bounded number of meshes: building more than `MESHES_KEPT` destroys the
least recently used one's process groups on every rank (each group costs a rank a gloo transport
thread that wakes every few milliseconds), and a dropped mesh asked for again is rebuilt and works."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from seqpar.algorithms.mesh import Grid
from seqpar.model.init import shard_rows
from seqpar.platform.localgang import MESHES_KEPT


def _groups(env) -> int:
    """Process groups alive on this rank."""
    return len(dist.distributed_c10d._world.pg_map)


def _sum_over_mesh(env) -> float:
    comm = env.mesh.comm("sp")
    return float(comm.all_gather(torch.tensor([float(env.rank)]), 0).sum())


def _keys(n: int) -> list[tuple]:
    """n distinct mesh keys on 4 ranks: the same grid under different node maps."""
    nodes = [(0, 0, 0, 0), (0, 0, 1, 1), (0, 1, 0, 1), (0, 1, 1, 0), (0, 0, 0, 1), (0, 1, 1, 1),
             (1, 0, 0, 0), (0, 1, 0, 0), (0, 0, 1, 0), (1, 1, 0, 0)]
    return [(Grid.line(4), (), n_) for n_ in nodes[:n]]


@pytest.mark.multirank
def test_the_gang_drops_the_least_recently_used_mesh_and_rebuilds_it_on_demand(gang):
    keys = _keys(MESHES_KEPT + 3)
    assert len(keys) > MESHES_KEPT, "the test needs more distinct meshes than the gang keeps"
    alive = []
    for key in keys:
        assert gang.run(_sum_over_mesh, size=4, mesh=key) == [6.0] * 4
        alive.append(max(gang.run(_groups, size=4)))
    # the groups alive stop growing once the cache is full: each new mesh replaces a dropped one
    assert alive[-1] == alive[MESHES_KEPT - 1], alive
    assert gang.run(_sum_over_mesh, size=4, mesh=keys[0]) == [6.0] * 4  # dropped, rebuilt


def _fsdp_rows(env) -> tuple[int, int]:
    """The rows of an FSDP2-sharded weight this rank holds, made as the model makes its own: on the
    meta device, sharded over the mesh's whole group, then given storage (to_empty)."""
    from torch.distributed.fsdp import fully_shard

    with torch.device("meta"):
        layer = nn.Linear(4, 8, bias=False)
    fully_shard(layer, mesh=env.mesh.shard_mesh("cpu"))
    layer.to_empty(device="cpu")
    return shard_rows(layer.weight)


@pytest.mark.multirank
def test_fsdp_shards_over_a_mesh_built_after_an_equal_one_was_dropped(gang):
    # the mesh FSDP2 shards over after a drop is the new one, not the dropped one that DTensor's
    # caches would hand back (localgang._drop says why)
    keys = _keys(MESHES_KEPT + 1)
    rows = [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert gang.run(_fsdp_rows, size=4, mesh=keys[0]) == rows
    for key in keys[1:]:  # the last one drops keys[0]
        gang.run(_groups, size=4, mesh=key)
    assert gang.run(_fsdp_rows, size=4, mesh=keys[0]) == rows  # rebuilt on new groups
