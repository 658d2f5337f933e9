"""Distributed attention algorithms: pure torch + torch.distributed (no Ray, no MLflow).

    attn = build_attention("ring", causal=True, layout="zigzag", group=my_sp_group)
    out = attn(q, k, v)          # local shards, (batch, seq, heads, head_dim)
    out.backward(grad)           # distributed and exact, too

`build_attention` lays the algorithm's rank grid on `group` as a mesh (mesh.py), or takes `mesh=`
built once by `mesh_for`. Each algorithm states its rules (`check`) and its analytic bytes per rank
per call (`expected_bytes`, net of skipped transfers given the call's relation; `skipped_bytes` what
is not sent), so a ledger from `recording()` can be held against it. Usage, options and the byte
table: docs/algorithms.md.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any

import torch.distributed as dist

from seqpar.algorithms import masks
from seqpar.algorithms.allgather import AllGather
from seqpar.algorithms.base import Algorithm, Attention, AttnShape, Geometry, Mask
from seqpar.algorithms.burst import Burst
from seqpar.algorithms.comm import Comm, Links, StrictOrder
from seqpar.algorithms.double_ring import DoubleRing
from seqpar.algorithms.layouts import LAYOUTS, check_layout
from seqpar.algorithms.ledger import Ledger, recording
from seqpar.algorithms.local import Local
from seqpar.algorithms.mesh import Grid, Mesh, build_mesh, view_mesh
from seqpar.algorithms.ring import Ring
from seqpar.algorithms.ulysses import Ulysses
from seqpar.algorithms.usp import Usp
from seqpar.algorithms.wallfacer import WallFacer
from seqpar.errors import SeqparError, require
from seqpar.rules import algorithms as rules_api
from seqpar.rules.options import Options
from seqpar.rules.peers import PREFIX as PEER_PREFIX

AlgorithmSpec = type[Algorithm]
REGISTRY: dict[str, AlgorithmSpec] = {}


def register(cls: AlgorithmSpec) -> AlgorithmSpec:
    REGISTRY[cls.name] = cls
    return cls


for _cls in (Local, AllGather, Ulysses, Ring, Usp, DoubleRing, WallFacer, Burst):
    register(_cls)


# Other projects' attentions, run by thin adapters ("peer:<name>", package seqpar.peers), live apart
# from seqpar's own: the planner, the tuner and `seqpar check` range over REGISTRY only. `get`
# imports the adapters' package on the first lookup of such a name (it registers them, or why one
# cannot run here), so this package names it but never needs it.
PEER_PACKAGE = "seqpar.peers"
PEERS: dict[str, AlgorithmSpec | str] = {}  # name -> class, or the one-line reason it cannot run


def register_peer(name: str, spec: AlgorithmSpec | str) -> None:
    PEERS[name] = spec


def get(name: str) -> AlgorithmSpec:
    if isinstance(name, str) and name.startswith(PEER_PREFIX):
        importlib.import_module(PEER_PACKAGE)
        require(name in PEERS, "algorithm", name, f"must be one of {', '.join(PEERS)}")
        spec = PEERS[name]
        require(not isinstance(spec, str), "algorithm", name, str(spec))
        return spec
    require(name in REGISTRY, "algorithm", name, f"must be one of {', '.join(REGISTRY)}")
    return REGISTRY[name]


def grid_for(name: str, world: int, nodes: Sequence[int] | None = None,
             **options: Any) -> Grid:
    """The rank grid `name` lays on `world` ranks (nodes: each rank's node id)."""
    return rules_api.grid_of(get(name), world, nodes, **options)


def mesh_for(name: str, world: int, *, dp: int = 1, members: Sequence[int] | None = None,
             nodes: Sequence[int] | None = None, links: Links | None = None,
             strict: bool | None = None, **options: Any) -> Mesh | None:
    """The mesh of `name` on global ranks `members` (default: the world), with a process group per
    axis; `dp` > 1 replicates it along a data-parallel axis "dp" (DP x SP, `world` ranks each).
    Collective over the whole world: every rank calls it with the same arguments (ranks outside
    `members` take part in group creation and get None). `nodes`: each member's node id; `links`:
    the link classes its Comms emulate; `strict`: NCCL's semantics on any backend (None:
    SEQPAR_STRICT_COMM)."""
    cls = get(name)
    sp_nodes = None if nodes is None else list(nodes)[:world]
    grid = grid_for(name, world, sp_nodes, **options)
    if dp == 1:
        return build_mesh(grid, cls.axes, members=members, nodes=nodes, links=links,
                          strict=strict)
    require(isinstance(dp, int) and dp > 1, "dp", dp, "must be a positive integer")
    return build_mesh(grid.with_dp(dp), (*cls.axes, "dp"), members=members, nodes=nodes,
                      links=links, strict=strict)


def _whole_world(comm: Comm) -> bool:
    return (comm.group is not None and dist.is_initialized()
            and comm.size == dist.get_world_size())


def build_attention(
    name: str, *, causal: bool = True, layout: str = "contiguous",
    group: dist.ProcessGroup | None = None, mesh: Mesh | None = None,
    nodes: Sequence[int] | None = None, links: Links | None = None, window: int | None = None,
    mask: masks.Mask | None = None, strict: bool | None = None, **options: Any,
) -> Attention:
    """A callable (q, k, v) -> out for this rank's shards; every rank of `group` must build it.

    `nodes` gives each rank of the group its node id (link classes in the ledger and in link
    emulation; burst's topology-aware ring); `links` the link classes to emulate (a given `mesh`
    brings its own: `Mesh.with_links`). Raises a SeqparError for an unknown name, layout or
    option before any communication. `window`: a sliding window of W keys (causal: query t sees keys
    t-W+1..t; full: |t - s| < W), inside each document when the call passes cu_seqlens. `mask`:
    any mask (`seqpar.algorithms.masks`), the whole relation of every call (it takes the place of
    causal, window and cu_seqlens; a call may pass its own).
    """
    cls = get(name)
    check_layout(layout)
    require(mask is None or isinstance(mask, masks.Mask), "mask", type(mask).__name__,
            "must be a seqpar.algorithms.masks.Mask (masks.causal(n), masks.block_sparse(...), ...)")
    require(mask is None or window is None, "window", window,
            "must be None with a mask (masks.sliding_window makes a window)")
    require(window is None or (isinstance(window, int) and window > 0), "window", window,
            "must be a positive integer (or None: no window)")
    opts = cls.parse(options)
    if mesh is None:
        if group is not None and not (dist.is_available() and dist.is_initialized()):
            raise SeqparError("group: torch.distributed is not initialised; "
                              "call init_process_group first or pass no group at world size 1")
        base = Comm(group, label="sp", links=links, order=StrictOrder.of(strict))
        opts.check(base.size)
        grid = cls.grid(base.size, opts, nodes)
        if _whole_world(base) and base.size > 1:
            mesh = build_mesh(grid, cls.axes, nodes=nodes, links=links, strict=base.strict)
        else:
            mesh = view_mesh(grid, cls.axes, base, nodes)
    else:
        world = mesh.comm("sp").size
        opts.check(world)
        want = cls.grid(world, opts, mesh.nodes)
        got = mesh.grid.sp_dims()
        require(got == want.dims, "mesh", [list(d) for d in got],
                f"{name} with these options needs the grid {[list(d) for d in want.dims]}")
    return Attention(cls(mesh, causal, layout, opts, window=window, mask=mask))


def check(name: str, shape: AttnShape, world: int, layout: str = "contiguous",
          causal: bool = True, **options: Any) -> None:
    """Every rule of `name` for this configuration, without any process group."""
    rules_api.check_of(get(name), shape, world, layout, causal, **options)


def expected_bytes(name: str, shape: AttnShape, world: int, *, layout: str | None = None,
                   causal: bool = True, cu_seqlens: Sequence[int] | None = None,
                   window: int | None = None, mask: masks.Mask | None = None,
                   rank: int | None = None, **options: Any) -> dict[str, int]:
    """Analytic bytes one rank sends per call, by phase ('forward', 'backward'): the most any rank
    sends, or `rank`'s. With the call's layout and relation (causal, cu_seqlens, window, or any
    `mask`) the count is net of the transfers the schedule skips (option skip_transfers, see
    `skipped_bytes`); without a layout it is the unskipped count."""
    return rules_api.expected_bytes_of(get(name), shape, world, layout=layout, causal=causal,
                                       cu_seqlens=cu_seqlens, window=window, mask=mask,
                                       rank=rank, **options)


def skipped_bytes(name: str, shape: AttnShape, world: int, *, layout: str, causal: bool = True,
                  cu_seqlens: Sequence[int] | None = None, window: int | None = None,
                  mask: masks.Mask | None = None, rank: int | None = None,
                  **options: Any) -> dict[str, int]:
    """Bytes per phase the schedule does not send under this mask because no query of the ranks
    a block would reach sees it (option skip_transfers; 0 for algorithms without a ring): `rank`'s,
    or (rank None) how far the busiest rank's count falls, i.e. `expected_bytes` without the mask
    minus `expected_bytes` with it."""
    return rules_api.skipped_bytes_of(get(name), shape, world, layout=layout, causal=causal,
                                      cu_seqlens=cu_seqlens, window=window, mask=mask,
                                      rank=rank, **options)


def options_of(name: str) -> Mapping[str, Any]:
    """The options an algorithm takes, with their defaults."""
    return rules_api.defaults_of(get(name))


def option_space(name: str, world: int) -> list[dict[str, Any]]:
    """Every configuration of `name` worth tuning at `world` ranks (its options' `space`): the
    algorithm's own options (not the kernel, scale and gradient dtype every algorithm takes)."""
    return rules_api.option_space_of(get(name), world)


__all__ = ["LAYOUTS", "PEERS", "REGISTRY", "Algorithm", "AlgorithmSpec", "Attention", "AttnShape",
           "Geometry", "Grid", "Ledger", "Mask", "Mesh", "Options", "build_attention", "build_mesh",
           "check", "expected_bytes", "get", "grid_for", "masks", "mesh_for", "option_space",
           "options_of", "recording", "register", "register_peer", "skipped_bytes"]
