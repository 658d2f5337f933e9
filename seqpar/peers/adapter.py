"""What every peer adapter shares: whether the peer can run here, the rules it states, the booking of
the bytes it sends, and the bridge from its own autograd to seqpar's forward/backward pair.

A peer is an `Algorithm` (so the harness builds, times, meters and checks it like seqpar's own) whose
forward and backward call the peer's code, imported from its installed package. Its communication
does not pass through `comm.py`, so `booking` wraps the torch.distributed functions the peer calls,
for the duration of the call only, and books each call's bytes by the NCCL-tests convention (the
bytes that leave this rank, per destination) into the active ledgers.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from seqpar.algorithms import kernels
from seqpar.algorithms.base import Algorithm, AttnShape
from seqpar.algorithms.comm import Comm, SubComm
from seqpar.algorithms.layouts import check_layout
from seqpar.algorithms.options import Options
from seqpar.errors import require

INSTALL = {"cpu": "pip install 'seqpar[peers]'", "gpu": "pip install 'seqpar[peers-gpu]'"}


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
    on other groups pass through unbooked."""
    originals = [(h, getattr(h.module, h.name)) for h in hooks]

    def wrap(hook: Hook, fn: Callable) -> Callable:
        group_of = _group_getter(hook, fn)

        def booked(*args: Any, **kwargs: Any) -> Any:
            group = group_of(args, kwargs)
            comm = comms.get(dist.group.WORLD if group is None else group)
            if comm is not None:
                comm._book(hook.op, hook.sends(comm, *args, **kwargs))
            return fn(*args, **kwargs)
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


class Peer(Algorithm):
    """An adapter around another project's attention. Subclasses name the modules the peer needs,
    whether it runs on CUDA only, the layouts it deals and its communication hooks."""

    modules: ClassVar[tuple[str, ...]] = ()      # import names that must be importable
    install: ClassVar[str] = INSTALL["cpu"]
    cuda_only: ClassVar[bool] = False
    layouts: ClassVar[tuple[str, ...]] = ("contiguous",)  # causal layouts it deals (full: any)
    kv_heads_divide_world: ClassVar[bool] = False         # it splits K,V heads over the group
    mha_only: ClassVar[bool] = False                      # it takes kv_heads == heads only

    @classmethod
    def unavailable(cls) -> str | None:
        """Why this peer cannot run on this machine (None: it can)."""
        missing = [m for m in cls.modules if importlib.util.find_spec(m.split(".")[0]) is None]
        if missing:
            return f"needs {', '.join(missing)}, not installed ({cls.install})"
        if cls.cuda_only and not torch.cuda.is_available():
            return "runs on CUDA GPUs only; this torch sees none"
        return None

    @classmethod
    def check(cls, shape: AttnShape, world: int, layout: str, causal: bool,
              options: Any, cu_seqlens: tuple[int, ...] | None = None) -> Options:
        check_layout(layout)
        require(not causal or layout in cls.layouts, "layout", layout,
                f"{cls.name} deals a causal sequence {' or '.join(cls.layouts)} only")
        require(not cu_seqlens, "documents", cu_seqlens, f"{cls.name} takes one document per row")
        return super().check(shape, world, layout, causal, options, cu_seqlens)

    @classmethod
    def rules(cls, shape: AttnShape, world: int, options: Options) -> None:
        if cls.kv_heads_divide_world:
            require(shape.kv_heads % world == 0, "kv_heads", shape.kv_heads,
                    f"{cls.name} splits K,V heads over the group: must be divisible by {world}")
            require(shape.heads % world == 0, "heads", shape.heads,
                    f"must be divisible by the world size ({world})")
        if cls.mha_only:
            require(shape.kv_heads == shape.heads, "kv_heads", shape.kv_heads,
                    f"{cls.name} takes as many K,V heads as query heads ({shape.heads})")

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        require(self.window is None, "window", self.window, f"{self.name} takes no window")
        group = self.comm.group
        require(self.world == 1 or (not isinstance(self.comm, SubComm) and group is not None),
                "algorithm", self.name, "a peer needs a process group of its own (build the "
                "attention on the whole world or pass mesh=)")

    def booking(self) -> contextlib.AbstractContextManager[None]:
        """Book the peer's calls on this rank's sequence-parallel group (see `booking`)."""
        return booking({self.comm.group: self.comm}, self.hooks())

    def hooks(self) -> Sequence[Hook]:
        return ()

    def book_share(self, q: torch.Tensor, factor: float) -> None:
        """Book this rank's FLOPs under the current phase as the call's total over P (factor 1:
        forward, 2.5: backward): a peer does not report the blocks it computes."""
        b, s, h, d = q.shape
        n = s * self.world
        kernels.book_flops(b, n, n, h, d, "causal" if self.causal else "full", factor / self.world)


class AutogradPeer(Peer):
    """A peer whose code is differentiable torch (autograd Functions and modules): forward runs it
    on fresh leaves and keeps its graph; backward runs that graph's backward."""

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, q, k, v):
        grads = any(t.requires_grad for t in (q, k, v))  # a forward-only call keeps no graph
        leaves = tuple(t.detach().requires_grad_(grads) for t in (q, k, v))
        self.book_share(q, 1.0)
        with torch.set_grad_enabled(grads), self.booking():
            out = self.run(*leaves)
        return out.detach(), (), (out, leaves)

    def backward(self, dout, saved, state):
        out, leaves = state
        self.book_share(leaves[0], 2.5)
        with self.booking():
            return torch.autograd.grad(out, leaves, dout)
