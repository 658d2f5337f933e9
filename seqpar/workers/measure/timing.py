"""The one measurement loop of every attention mode: `timed_pass` (barrier, device sync, forward,
sync, backward, sync) and `iterate` (warm-up, one memory-metered pass, timed passes, the host's
noise over them: `noise.NoiseMeter`).

The memory rule: memory is measured over one untimed pass, the last warm-up one, or an extra one
after a single warm-up (a process's first pass also allocates one-time state); over many passes the
resident high-water mark would add up heap fragmentation. The first timed pass books the ledger.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import torch
import torch.distributed as dist

from seqpar import algorithms
from seqpar.algorithms.ledger import Ledger
from seqpar.workers.measure.meters import MemoryMeter
from seqpar.workers.measure.noise import NoiseMeter

T = TypeVar("T")


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
    """What `iterate` measured: per timed pass its seconds, the memory peak, one pass's ledger,
    the last timed pass's output and the host's noise over the timed passes."""

    fwd_s: list[float]
    bwd_s: list[float]
    peak_mem_bytes: int
    mem_method: str
    ledger: Ledger
    last: T
    noise: dict[str, Any] = field(default_factory=dict)


def iterate(one_pass: Callable[[], tuple[float, float, T]], warmup: int, iters: int,
            device: torch.device) -> Loop[T]:
    """Warm-up passes, one memory-metered untimed pass, then `iters` timed passes, the first under
    the ledger (see the module docstring). `one_pass` returns (forward s, backward s, output)."""
    meter = MemoryMeter(device)
    for _ in range(warmup - 1 if warmup >= 2 else warmup):
        one_pass()
    meter.start()
    one_pass()
    peak = meter.stop()
    fwd, bwd = [], []
    with NoiseMeter() as noise:
        with algorithms.recording() as ledger:
            f, b, last = one_pass()
        fwd.append(f)
        bwd.append(b)
        for _ in range(iters - 1):
            f, b, last = one_pass()
            fwd.append(f)
            bwd.append(b)
    return Loop(fwd, bwd, peak, meter.method, ledger, last, noise.sample)
