"""Booking a peer's bytes: its communication does not pass through `comm.py`, so `booking` wraps
the torch.distributed functions the peer calls, for the duration of the call only, and books each
call's bytes by the NCCL-tests convention (the bytes that leave this rank, per destination) into
the active ledgers, under the label of the seqpar Comm whose process group the call names.
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from seqpar.algorithms.comm import Comm


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@dataclass(frozen=True)
class Hook:
    """A torch.distributed function a peer calls: where it lives, the ledger op it books as,
    `sends(comm, *args, **kwargs) -> {group rank: bytes}` for one call, and where the call names
    its process group (an argument, or `group_from(args, kwargs)`)."""

    module: Any
    name: str
    op: str
    sends: Callable[..., dict[int, int]]
    group_arg: str = "group"
    group_from: Callable[[tuple, dict], Any] | None = None


def _group_getter(hook: Hook, fn: Callable) -> Callable[[tuple, dict], Any]:
    """A function (args, kwargs) -> the process group argument of a call of `fn`."""
    if hook.group_from is not None:
        return hook.group_from
    names = list(inspect.signature(fn).parameters)
    index = names.index(hook.group_arg) if hook.group_arg in names else None

    def group(args: tuple, kwargs: dict) -> Any:
        if hook.group_arg in kwargs:
            return kwargs[hook.group_arg]
        return args[index] if index is not None and index < len(args) else None
    return group


@contextlib.contextmanager
def booking(comms: dict[Any, Comm], hooks: Sequence[Hook]) -> Iterator[None]:
    """Inside the block, every call of a hooked function on one of `comms`' process groups books
    its bytes under that Comm's label (link classes by its node map) in the active ledgers; calls
    on other groups pass through unbooked. Under link emulation (comm.py) a booked call returns no
    earlier than its emulated transfer time after it started: an asynchronous call waits for it at
    once, so a peer's overlap of communication with compute is not credited while emulating."""
    originals = [(h, getattr(h.module, h.name)) for h in hooks]

    def wrap(hook: Hook, fn: Callable) -> Callable:
        group_of = _group_getter(hook, fn)

        def booked(*args: Any, **kwargs: Any) -> Any:
            group = group_of(args, kwargs)
            comm = comms.get(dist.group.WORLD if group is None else group)
            if comm is None:
                return fn(*args, **kwargs)
            emulated_s = comm._book(hook.op, hook.sends(comm, *args, **kwargs))
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            if emulated_s:
                comm._finish(start, emulated_s)
            return out
        return booked

    for hook, fn in originals:
        setattr(hook.module, hook.name, wrap(hook, fn))
    try:
        yield
    finally:
        for hook, fn in originals:
            setattr(hook.module, hook.name, fn)


def equal_alltoall_sends(comm: Comm, output: torch.Tensor, input: torch.Tensor, *args: Any,
                         **kwargs: Any) -> dict[int, int]:
    """dist.all_to_all_single with equal splits: 1/size of the input to every other rank."""
    return {i: nbytes(input) // comm.size for i in range(comm.size) if i != comm.rank}


def gather_sends(comm: Comm, output: torch.Tensor, input: torch.Tensor, *args: Any,
                 **kwargs: Any) -> dict[int, int]:
    """dist.all_gather_into_tensor: the input to every other rank."""
    return {i: nbytes(input) for i in range(comm.size) if i != comm.rank}


def scatter_sends(comm: Comm, output: torch.Tensor, input: torch.Tensor, *args: Any,
                  **kwargs: Any) -> dict[int, int]:
    """dist.reduce_scatter_tensor: every other rank's chunk of the input to it."""
    return {i: nbytes(input) // comm.size for i in range(comm.size) if i != comm.rank}


def p2p_sends(comm: Comm, ops: Sequence[Any], *args: Any, **kwargs: Any) -> dict[int, int]:
    """dist.batch_isend_irecv: each isend's tensor to its peer (a global rank)."""
    out: dict[int, int] = {}
    for op in ops:
        if op.op in (dist.isend, dist.send):
            peer = comm.global_ranks.index(op.peer)
            out[peer] = out.get(peer, 0) + nbytes(op.tensor)
    return out


def p2p_group(args: tuple, kwargs: dict) -> Any:
    ops = args[0] if args else kwargs.get("p2p_op_list", [])
    return ops[0].group if ops else None


P2P_HOOK = Hook(dist, "batch_isend_irecv", "p2p", p2p_sends, group_from=p2p_group)
