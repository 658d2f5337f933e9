"""The one measurement loop of every mode, training included: `iterate` (warm-up, then the timed
passes with the memory meter and the host's noise over them: `noise.NoiseMeter`; on a CPU the
host's speed before and after them: `probe`) around a mode's
pass; `timed_pass` is the attention modes' pass (barrier, device sync, forward, sync, backward,
sync), training has its step (`train.py`).

The memory rule, one for every mode: the peak over the timed passes only, after at least one warm
pass (a process's first pass allocates one-time state: AdamW's moments, FSDP's lazy init, cuBLAS and
NCCL workspaces), with the peak reset when the timed passes begin (`meters.MemoryMeter`: on CUDA
also the allocator's reserved peak and the device's own view). The first timed pass books the
ledger.

Progress: within `counting(tick, loop_done)` (this thread's context) every pass of `iterate`,
warm-up included, calls `tick()`, and its end `loop_done()` (what follows is the mode's own: the
training's memory forward): the rank actor shows both on the dashboard.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import torch
import torch.distributed as dist

from seqpar import algorithms
from seqpar.algorithms.ledger import Ledger
from seqpar.algorithms.observe import waiting
from seqpar.workers.measure.meters import Memory, MemoryMeter
from seqpar.workers.measure.noise import NoiseMeter
from seqpar.workers.measure.probe import probe_seconds

T = TypeVar("T")

_tick: ContextVar[Callable[[], None] | None] = ContextVar("seqpar_pass_tick", default=None)
_loop_done: ContextVar[Callable[[], None] | None] = ContextVar("seqpar_loop_done", default=None)


@contextlib.contextmanager
def counting(tick: Callable[[], None], loop_done: Callable[[], None] | None = None
             ) -> Iterator[None]:
    """Within this block (this thread's context), `tick()` after every pass of `iterate` and
    `loop_done()` when its last pass is over."""
    tokens = _tick.set(tick), _loop_done.set(loop_done)
    try:
        yield
    finally:
        _tick.reset(tokens[0])
        _loop_done.reset(tokens[1])


def sync(device: torch.device) -> None:
    """Wait for the device's queued kernels (a no-op on CPU, where calls return when done)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_pass(attn: Callable[..., torch.Tensor], inputs: Sequence[torch.Tensor],
               dout: torch.Tensor | None, docs: dict[str, Any], group: dist.ProcessGroup | None,
               device: torch.device) -> tuple[float, float, tuple[torch.Tensor, ...]]:
    """One timed call on fresh leaves of `inputs` (q, k, v), after a barrier: (forward seconds,
    backward seconds (0 without dout), (out, q, k, v)), synchronised on CUDA so the clock sees
    the kernels, not their enqueue."""
    q, k, v = (t.detach().requires_grad_(dout is not None) for t in inputs)
    if group is not None:
        with waiting("barrier"):
            dist.barrier(group=group)
    sync(device)
    t0 = time.perf_counter()
    out = attn(q, k, v, **docs)
    sync(device)
    t1 = time.perf_counter()
    if dout is not None:
        out.backward(dout)
        sync(device)
    return t1 - t0, time.perf_counter() - t1, (out, q, k, v)


@dataclass
class Loop(Generic[T]):
    """What `iterate` measured: per timed pass its seconds, the memory over the timed passes, one
    pass's ledger, the last timed pass's output and the host's noise over the timed passes."""

    fwd_s: list[float]
    bwd_s: list[float]
    memory: Memory
    ledger: Ledger
    last: T
    noise: dict[str, Any] = field(default_factory=dict)


def iterate(one_pass: Callable[[], tuple[float, float, T]], warmup: int, iters: int,
            device: torch.device, nodes: Sequence[int] | None = None) -> Loop[T]:
    """max(1, warmup) warm passes, then `iters` timed passes under the memory meter and the noise
    meter, the first under the ledger (`nodes`: the node map it classes links by; default each
    mesh's). `one_pass` returns (forward s, backward s, output). See the module docstring."""
    tick = _tick.get() or _nothing
    for _ in range(max(1, warmup)):
        one_pass()
        tick()
    meter = MemoryMeter(device)
    fwd, bwd = [], []
    probe = probe_seconds() if device.type == "cpu" else None  # the host's speed (`probe`)
    meter.start()
    with NoiseMeter() as noise:
        for i in range(iters):
            if i == 0:
                with algorithms.recording(nodes) as ledger:
                    f, b, last = one_pass()
            else:
                f, b, last = one_pass()
            meter.sample()
            fwd.append(f)
            bwd.append(b)
            tick()
    memory = meter.stop()
    if probe is not None:  # before and after the timed passes
        noise.sample["probe_s"] = (probe + probe_seconds()) / 2
    (_loop_done.get() or _nothing)()
    return Loop(fwd, bwd, memory, ledger, last, noise.sample)


def _nothing() -> None:
    pass
