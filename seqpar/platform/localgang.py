"""A gang of local rank processes with a torch.distributed group: no Ray, one machine.

`seqpar check` and the multi-rank tests use it. Processes start once and then run any number of
module-level functions, so the cost of start-up (importing torch, forming the group) is paid once.
On a machine with at least `world` GPUs the ranks use NCCL and one GPU each; elsewhere gloo on CPU.
Sub-groups of the first k ranks exist for every size in `sizes`, so one gang of 8 also runs P = 2,
3 and 4. `run(..., mesh=key)` first builds (or reuses) a mesh on ranks [0, size) — collectively, on
every rank of the gang, as `algorithms.mesh.build_mesh` requires — and hands it to fn as `env.mesh`.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue
import socket
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from seqpar.algorithms.mesh import build_mesh
from seqpar.errors import SeqparError
from seqpar.platform.devices import process_group_kwargs

PARENT_CHECK_S = 5.0  # how often an idle rank checks that its driver is still alive


class RankFailure(RuntimeError):
    """A rank raised; the message carries its traceback."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def device_kind(world: int, override: str | None = None) -> str:
    """'cuda' when this machine has a GPU for every rank (or when asked), else 'cpu'."""
    import torch

    if override is not None:
        if override not in ("cpu", "cuda"):
            raise SeqparError(f"device={override!r}: must be 'cpu' or 'cuda'")
        if override == "cuda" and torch.cuda.device_count() < world:
            raise SeqparError(f"device='cuda': needs {world} GPUs, this machine has "
                              f"{torch.cuda.device_count()}")
        return override
    return "cuda" if torch.cuda.is_available() and torch.cuda.device_count() >= world else "cpu"


@dataclass
class RankEnv:
    """What a function run on the gang sees on its rank."""

    rank: int
    world: int
    device: str
    groups: dict[int, Any] = field(default_factory=dict)  # size k -> group of ranks [0, k)
    mesh: Any = None  # the mesh of this run (run(..., mesh=key)), None without one
    meshes: dict[Any, Any] = field(default_factory=dict)  # (size, key) -> mesh, built once

    def group(self, size: int):
        return self.groups[size]


MeshKey = tuple  # (grid, axes, nodes): see algorithms.mesh.build_mesh


# Meshes a rank keeps built, least recently used dropped first. Every process group costs a rank a
# gloo transport thread that wakes every few milliseconds even when idle (and an NCCL communicator
# its GPU memory): dozens of kept meshes took most of a core from 8 ranks on 2 cores. Every rank
# sees every task, so every rank drops the same mesh at the same moment.
MESHES_KEPT = 6


def _mesh(env: RankEnv, size: int, key: MeshKey):
    """The mesh `key` on ranks [0, size), built on every rank of the gang the first time it is
    asked for since it was last dropped."""
    if (size, key) in env.meshes:
        env.meshes[size, key] = env.meshes.pop((size, key))  # now the most recently used
        return env.meshes[size, key]
    if len(env.meshes) >= MESHES_KEPT:
        # a peer may still be reading what this rank last sent on a group: destroy none of them
        # (closing its connections) before every rank is done with the previous task
        import torch.distributed as dist

        dist.barrier()
        while len(env.meshes) >= MESHES_KEPT:
            _drop(env, env.meshes.pop(next(iter(env.meshes))))
    grid, axes, nodes = key
    env.meshes[size, key] = build_mesh(grid, axes, members=range(size), nodes=nodes)
    return env.meshes[size, key]


def _drop(env: RankEnv, mesh: Any) -> None:
    """Destroy the process groups `mesh` made (not the world's, not the gang's own sub-groups), and
    empty DTensor's caches of output shardings.

    Those caches key an operation by its inputs' DeviceMeshes, which compare equal when their ranks
    and dim names do, whatever their groups, and the result carries the cached mesh: left full, a
    later `to_empty` of meta parameters FSDP2 shards over a new mesh of the same ranks would hand
    them the dropped mesh, whose group name no longer resolves (torch 2.13: "Could not resolve the
    process group registered under the name N")."""
    import torch.distributed as dist
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    if mesh is None:  # this rank only took part in building it
        return
    kept = {id(dist.group.WORLD), *(id(g) for g in env.groups.values())}
    made = {id(c.group): c.group for c in mesh.comms.values() if c.group is not None}
    if mesh.whole is not None:
        made[id(mesh.whole)] = mesh.whole
    for key, group in made.items():
        if key not in kept:
            dist.destroy_process_group(group)
    _clear_sharding_prop_cache()


def _worker(rank: int, world: int, port: int, device: str, sizes: tuple[int, ...],
            threads: int, tasks: mp.Queue, results: mp.Queue) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    index = rank if device == "cuda" else None  # rank r of a local gang uses GPU r
    if index is not None:
        torch.cuda.set_device(index)
    dist.init_process_group(init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=300), **process_group_kwargs(device, index))
    env = RankEnv(rank, world, f"cuda:{index}" if index is not None else "cpu")
    for k in sizes:
        group = dist.group.WORLD if k == world else dist.new_group(list(range(k)))
        if rank < k:
            env.groups[k] = group
    dist.barrier()  # every group exists on every rank before the first task
    results.put(pickle.dumps((rank, True, "ready")))
    parent = os.getppid()
    while True:
        try:
            item = tasks.get(timeout=PARENT_CHECK_S)
        except queue.Empty:
            if os.getppid() != parent:  # the driver died without closing us: do not linger
                os._exit(0)
            continue
        if item is None:
            # every rank stops at once: tearing down the gang's (and its meshes') groups one by one
            # would only wait on peers that are exiting too
            os._exit(0)
        fn, args, size, mesh_key = pickle.loads(item)
        try:
            env.mesh = None if mesh_key is None else _mesh(env, size, mesh_key)
            if rank >= size:
                continue  # took part in building the mesh only
            payload = (rank, True, fn(env, *args))
        except BaseException:  # report every failure with its traceback
            payload = (rank, False, traceback.format_exc())
        results.put(pickle.dumps(payload))


class LocalGang:
    """`world` local processes in one process group; `run(fn, *args)` calls fn(env, *args) on each."""

    def __init__(self, world: int, sizes: Iterable[int] = (), device: str | None = None,
                 threads: int = 1, start_timeout_s: float = 180.0):
        self.world = world
        self.device = device_kind(world, device)
        self.sizes = tuple(sorted({*sizes, world}))
        ctx = mp.get_context("spawn")
        self._results = ctx.Queue()
        self._tasks = [ctx.Queue() for _ in range(world)]
        port = free_port()
        self._procs = [
            ctx.Process(target=_worker, daemon=True, name=f"seqpar-rank-{r}",
                        args=(r, world, port, self.device, self.sizes, threads, self._tasks[r],
                              self._results))
            for r in range(world)
        ]
        for p in self._procs:
            p.start()
        try:
            self._collect(range(world), start_timeout_s)
        except BaseException:
            self.close()
            raise

    def _collect(self, ranks: Iterable[int], timeout_s: float) -> list[Any]:
        want = set(ranks)
        got: dict[int, Any] = {}
        errors: dict[int, str] = {}
        deadline = time.monotonic() + timeout_s
        while want - set(got) - set(errors):
            try:  # a second at a time: a rank that died (never to answer) ends the wait at once
                rank, ok, value = pickle.loads(self._results.get(
                    timeout=max(0.0, min(1.0, deadline - time.monotonic()))))
            except queue.Empty:
                dead = [p.name for r, p in enumerate(self._procs)
                        if r in want - set(got) - set(errors) and not p.is_alive()]
                if dead or time.monotonic() >= deadline:
                    raise RankFailure(f"no answer within {timeout_s:.0f} s" if not dead else
                                      f"ranks died without answering: {dead}") from None
                continue
            if ok:
                got[rank] = value
            else:
                errors[rank] = value
        if errors:
            raise RankFailure("\n".join(f"rank {r}: {tb}" for r, tb in sorted(errors.items())))
        return [got[r] for r in sorted(got)]

    def run(self, fn: Callable[..., Any], *args: Any, size: int | None = None,
            mesh: MeshKey | None = None, timeout_s: float = 300.0) -> list[Any]:
        """Run fn(env, *args) on ranks [0, size) (all by default); results in rank order.

        With `mesh` = (grid, axes, nodes) every rank of the gang first builds that mesh on ranks
        [0, size) (once per key), and fn finds it as env.mesh."""
        size = self.world if size is None else size
        if size not in self.sizes:
            raise SeqparError(f"size={size}: this gang has groups of {self.sizes}")
        message = pickle.dumps((fn, args, size, mesh))
        for r in range(self.world if mesh is not None else size):
            self._tasks[r].put(message)
        return self._collect(range(size), timeout_s)

    def close(self) -> None:
        for q, p in zip(self._tasks, self._procs, strict=True):
            if p.is_alive():
                q.put(None)
        deadline = time.monotonic() + 10
        for p in self._procs:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()

    def __enter__(self) -> LocalGang:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
