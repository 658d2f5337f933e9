"""Count what the host issues while the real code runs: aten operations that launch work,
attention kernel calls, collectives, point-to-point messages and host synchronisations.

    with OpCounter() as c:
        with c.phase("forward"):
            loss = net.loss(tokens)
        with c.phase("backward"):
            loss.backward()
    c.tally("forward", "attention").ops, c.tally("backward", "other").collectives, ...

The rule for "launches work" (what would launch a kernel on a GPU): every aten operation the
dispatcher sees, except views and metadata (`func.is_view`, `NO_LAUNCH`: reshape, detach,
allocations left uninitialised such as empty / empty_like / empty_strided); a fill (zeros,
zeros_like, full, ones) launches one, so it counts. Each is counted once, at the top of the
dispatch (what an op does inside its own kernel is not seen). A host read of a device value
(`SYNCS`: .item(), nonzero, boolean indexing, ...) is a sync, not an op; so is a barrier.

Parts: ops inside a distributed attention (its Algorithm's forward / backward and the call's own
padding) are "attention", the rest "other"; inside an attention kernel call (one entry of
`kernels.engines`, one flash-attn launch on a GPU) ops are "kernel ops", not ops, so a backend
can be charged per call. Communication: each `algorithms.comm.Comm` operation is one collective
(all_to_all, all_gather, reduce_scatter) or its sends + receives are messages, whatever gloo does
under it (a view mesh's collective is point-to-point underneath); its bytes are the ledger's. A
torch.distributed call outside a Comm (gradient all-reduce, FSDP2, ZeRO-1, the loss) is counted
from the dispatcher's c10d operations.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from seqpar.algorithms import REGISTRY, ledger
from seqpar.algorithms import base as algo_base
from seqpar.algorithms.comm import Comm
from seqpar.algorithms.kernels import engines

aten = torch.ops.aten
# metadata and uninitialised allocations: no kernel on a GPU (views are found by func.is_view)
NO_LAUNCH = {
    "_unsafe_view", "detach", "lift_fresh", "empty", "empty_like", "empty_strided", "new_empty",
    "new_empty_strided", "resize_", "set_", "_reshape_alias", "sym_size", "sym_stride",
    "sym_numel", "sym_storage_offset", "is_same_size", "_has_compatible_shallow_copy_type",
}
# a host read of a device value: the host waits for the device (on CUDA)
SYNCS = {"_local_scalar_dense", "nonzero", "masked_select", "is_nonzero", "equal", "allclose",
         "unique", "_unique", "_unique2", "unique_consecutive", "unique_dim", "nonzero_static"}
COLLECTIVES = {
    "allreduce_", "allreduce_coalesced_", "allgather_", "_allgather_base_", "allgather_coalesced_",
    "allgather_into_tensor_coalesced_", "reduce_scatter_", "_reduce_scatter_base_",
    "reduce_scatter_tensor_coalesced_", "alltoall_", "alltoall_base_", "broadcast_", "reduce_",
    "gather_", "scatter_",
}
MESSAGES = {"send", "recv_", "recv_any_source_"}
HOST_WAITS = {"barrier", "monitored_barrier_"}
PARTS = ("attention", "other")


@dataclass
class Tally:
    """What one phase's part issued."""

    ops: int = 0            # aten operations that launch work, outside kernel calls
    kernel_calls: int = 0   # attention kernel calls
    kernel_ops: int = 0     # aten operations inside those calls
    collectives: int = 0
    messages: int = 0       # sends + receives posted
    syncs: int = 0          # host waits on the device
    comm: Counter = field(default_factory=Counter)        # (kind, group size) -> calls
    comm_bytes: Counter = field(default_factory=Counter)  # (kind, group size) -> bytes (ledger's)
    by_op: Counter = field(default_factory=Counter)       # op name -> launches (for reading)

    def add_comm(self, kind: str, size: int, calls: int, nbytes: int) -> None:
        self.comm[kind, size] += calls
        self.comm_bytes[kind, size] += nbytes

    def counts(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in
                ("ops", "kernel_calls", "kernel_ops", "collectives", "messages", "syncs")}

    def as_dict(self) -> dict[str, Any]:
        return {**self.counts(),
                "comm": {f"{k}@{g}": n for (k, g), n in sorted(self.comm.items())},
                "comm_bytes": {f"{k}@{g}": n for (k, g), n in sorted(self.comm_bytes.items())}}


def _name(func) -> tuple[str, str]:
    """(namespace, op name without overload) of an OpOverload."""
    packet = func.overloadpacket
    return getattr(packet, "_qualified_op_name", str(packet)).split("::")[0], func.__name__.split(".")[0]


def _group_size(args: Any) -> int:
    import torch.distributed as dist

    for a in args:
        if isinstance(a, torch.ScriptObject):
            with contextlib.suppress(Exception):
                return int(dist.ProcessGroup.unbox(a).size())
    return 0


def _tensor_bytes(args: Any) -> int:
    first = next((a for a in args if isinstance(a, torch.Tensor | list)), None)
    tensors = first if isinstance(first, list) else [first] if first is not None else []
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


class _Mode(TorchDispatchMode):
    def __init__(self, counter: OpCounter):
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counter._see(func, args)
        return func(*args, **(kwargs or {}))


class OpCounter:
    """Counts while active (see the module docstring); `phase(name)` says whose the counts are."""

    def __init__(self) -> None:
        self.tallies: dict[tuple[str, str], Tally] = {}
        self._phase = "forward"
        self._attention = 0  # depth inside a distributed attention
        self._kernel = 0     # depth inside a kernel call
        self._comm = 0       # depth inside a Comm operation
        self._stack = contextlib.ExitStack()

    def tally(self, phase: str, part: str = "other") -> Tally:
        return self.tallies.setdefault((phase, part), Tally())

    def total(self, phase: str) -> Tally:
        """Both parts of a phase added (kernel calls are the attention's)."""
        out = Tally()
        for part in PARTS:
            t = self.tally(phase, part)
            for k, v in t.counts().items():
                setattr(out, k, getattr(out, k) + v)
            out.comm.update(t.comm)
            out.comm_bytes.update(t.comm_bytes)
            out.by_op.update(t.by_op)
        return out

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        before, self._phase = self._phase, name
        try:
            yield
        finally:
            self._phase = before

    def _here(self) -> Tally:
        return self.tally(self._phase, "attention" if self._attention else "other")

    def _see(self, func, args) -> None:
        space, name = _name(func)
        t = self._here()
        if space == "c10d":
            if self._comm:
                return  # counted as the Comm operation it serves
            if name in COLLECTIVES:
                t.collectives += 1
                t.add_comm(name.strip("_"), _group_size(args), 1, _tensor_bytes(args))
            elif name in MESSAGES:
                t.messages += 1
                t.add_comm(name.strip("_"), _group_size(args), 1, _tensor_bytes(args))
            elif name in HOST_WAITS:
                t.syncs += 1
            return
        if name in SYNCS or (name == "index" and _bool_index(args)):
            t.syncs += 1
            return
        if func.is_view or name in NO_LAUNCH:
            return
        if self._kernel:
            t.kernel_ops += 1
        else:
            t.ops += 1
            t.by_op[name] += 1

    # -- the hooks: regions of the real code ---------------------------------------------------
    def _region(self, attr: str, fn: Callable, on_kernel: bool = False) -> Callable:
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            if on_kernel and not self._kernel:
                self._here().kernel_calls += 1
            setattr(self, attr, getattr(self, attr) + 1)
            try:
                return fn(*args, **kwargs)
            finally:
                setattr(self, attr, getattr(self, attr) - 1)
        return wrapped

    def _comm_op(self, kind: str, fn: Callable) -> Callable:
        counter = self

        @functools.wraps(fn)
        def wrapped(comm: Comm, *args, **kwargs):
            counter._comm += 1
            try:
                with ledger.recording() as own:
                    out = fn(comm, *args, **kwargs)
            finally:
                counter._comm -= 1
            t = counter._here()
            if kind == "p2p":
                sends, recvs = args[0], args[1]
                n = len(sends) + len(recvs)
                if n and comm.size > 1:
                    t.messages += n
                    t.add_comm("p2p", comm.size, n, own.total())
            elif comm.size > 1:
                t.collectives += 1
                t.add_comm(kind, comm.size, 1, own.total())
            return out
        return wrapped

    def _patch(self, owner: Any, attr: str, value: Any) -> None:
        old = owner[attr] if isinstance(owner, dict) else owner.__dict__[attr]
        if isinstance(owner, dict):
            owner[attr] = value
            self._stack.callback(owner.__setitem__, attr, old)
        else:
            setattr(owner, attr, value)
            self._stack.callback(setattr, owner, attr, old)

    def __enter__(self) -> OpCounter:
        for table in (engines.FORWARD, engines.BACKWARD, engines.WINDOW_FORWARD,
                      engines.WINDOW_BACKWARD, engines.VARLEN_FORWARD, engines.VARLEN_BACKWARD):
            for key, fn in list(table.items()):
                self._patch(table, key, self._region("_kernel", fn, on_kernel=True))
        for kind, attr in (("p2p", "exchange"), ("all_to_all", "all_to_all"),
                           ("all_gather", "all_gather"), ("reduce_scatter", "reduce_scatter")):
            self._patch(Comm, attr, self._comm_op(kind, getattr(Comm, attr)))
        self._patch(algo_base.Attention, "__call__",
                    self._region("_attention", algo_base.Attention.__call__))
        self._patch(algo_base._Shell, "backward",
                    staticmethod(self._region("_attention", algo_base._Shell.backward)))
        for cls in REGISTRY.values():
            for attr in ("forward", "backward"):
                if attr in cls.__dict__:
                    self._patch(cls, attr, self._region("_attention", cls.__dict__[attr]))
        self._stack.enter_context(_Mode(self))
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()


def _bool_index(args: Any) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or ())


# ------------------------------------------------- what the operation table's counts share (optable)
CONFIG = dict(vocab=97, hidden=32, heads=4, kv_heads=2, ffn=64)  # the table's tiny model
FIELDS = ("ops", "kernel_calls", "kernel_ops", "collectives", "messages", "syncs")


def busiest(per_rank: list) -> dict[str, dict[str, Any]] | str:
    """Each field's largest count over the ranks (the rank that issues most); comm from rank 0."""
    if any(isinstance(r, str) for r in per_rank):
        return next(r for r in per_rank if isinstance(r, str))
    return {ph: {**{f: max(r[ph][f] for r in per_rank) for f in FIELDS},
                 "comm": per_rank[0][ph]["comm"], "comm_bytes": per_rank[0][ph]["comm_bytes"]}
            for ph in ("forward", "backward")}


def count_model(net: Any, tokens: torch.Tensor) -> dict[str, dict[str, dict]]:
    """{phase: {part: counts}} of one forward to the loss and its backward (after a warm one)."""
    net.loss(tokens).backward()
    net.zero_grad(set_to_none=True)
    with OpCounter() as c:
        with c.phase("forward"):
            loss = net.loss(tokens)
        with c.phase("backward"):
            loss.backward()
    net.zero_grad(set_to_none=True)
    return {ph: {p: c.tally(ph, p).as_dict() for p in ("attention", "other")}
            for ph in ("forward", "backward")}


def minus(a: dict, b: dict) -> dict:
    """a - b, field by field."""
    return {f: a[f] - b[f] for f in FIELDS}


def linear(points: list[tuple[int, dict]], check: list[tuple[int, dict]] = ()) -> dict[str, Any]:
    """count(x) = a + b * x per field through two points, and whether it holds at `check`."""
    (x0, c0), (x1, c1) = points
    law = {}
    for f in FIELDS:
        b = (c1[f] - c0[f]) / (x1 - x0)
        law[f] = [c0[f] - b * x0, b]
    holds = all(math.isclose(law[f][0] + law[f][1] * x, c[f]) for x, c in check for f in FIELDS)
    return {"law": law, "holds": holds, "points": {str(x): {f: c[f] for f in FIELDS}
                                                  for x, c in [*points, *check]}}
