"""One trial on one rank: random shards in the case's layout, warm-up, timed iterations, memory and
the communication ledger of one iteration.

Memory is measured over one untimed iteration (the last warm-up one, or one more after a single
warm-up): on CUDA the allocator's peak
(`torch.cuda.max_memory_allocated`) above what was allocated before it; on CPU the process's resident
high-water mark (VmHWM, reset through /proc/self/clear_refs after glibc's malloc_trim has handed freed
heap pages back) minus the resident size just before it, i.e. the memory the iteration touched,
heap fragmentation included. Where the reset is not permitted the method says 'rss-delta-unreset'
and the number is an upper bound.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from seqpar import algorithms
from seqpar.algorithms import layouts
from seqpar.algorithms.base import DTYPES
from seqpar.algorithms.mesh import Mesh
from seqpar.case import Case


@dataclass
class RankMeasurement:
    rank: int
    step_ms: list[float]
    fwd_ms: list[float]
    bwd_ms: list[float]
    flops: dict[str, float]          # attention FLOPs this rank did in one iteration, by phase
    ledger: dict[str, Any]           # one iteration's ledger (entries and flops)
    bytes_sent: dict[str, int]       # one iteration, by phase
    peak_mem_bytes: int
    mem_method: str
    extra: dict[str, Any] = field(default_factory=dict)

    def median_step_ms(self) -> float:
        return statistics.median(self.step_ms)

    def timing_summary(self) -> dict[str, float]:
        """Median and spread (10th / 90th percentile) of each phase's time over the iterations."""
        out = {}
        for name, values in (("step_ms", self.step_ms), ("fwd_ms", self.fwd_ms),
                             ("bwd_ms", self.bwd_ms)):
            out[name] = statistics.median(values)
            out[f"{name}_p10"], out[f"{name}_p90"] = percentile(values, 10), percentile(values, 90)
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation; a single value is every percentile."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _vm_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


@functools.lru_cache(maxsize=1)
def _libc():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def _release_free_heap() -> None:
    """Hand freed heap pages back to the OS (glibc malloc_trim), so that memory an earlier, larger
    trial freed but kept resident is faulted in again when reused and shows in the high-water mark."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


class MemoryMeter:
    """Peak memory of the code between start() and stop(), by the best method the device has."""

    def __init__(self, device: torch.device):
        self.device = device
        self.method = "cuda-allocator-peak" if device.type == "cuda" else "rss-hwm-delta"
        self._base = 0

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
            return
        _release_free_heap()
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
        except OSError:
            self.method = "rss-delta-unreset"
        self._base = _vm_kib("VmRSS") * 1024

    def stop(self) -> int:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return torch.cuda.max_memory_allocated(self.device) - self._base
        return max(0, _vm_kib("VmHWM") * 1024 - self._base)


class SavedTensorMeter:
    """Bytes of the tensors autograd saves for backward inside the block (the activation memory
    WallFacer's Eq. 9-10 count): deterministic where an RSS peak is noise at small sizes.

        with SavedTensorMeter() as saved:
            out = attn(q, k, v)
        saved.nbytes
    """

    def __init__(self) -> None:
        self._storages: dict[int, int] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()  # a storage saved twice (or viewed) counts once
        self._storages[storage.data_ptr()] = storage.nbytes()
        return t

    @property
    def nbytes(self) -> int:
        return sum(self._storages.values())

    def __enter__(self) -> SavedTensorMeter:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.__exit__(*exc)


def local_inputs(case: Case, rank: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """This rank's q, k, v and upstream gradient, drawn from (seed, rank) at shard size."""
    g = torch.Generator().manual_seed(case.seed * 1_000_003 + rank)
    s = (len(layouts.positions(case.layout, rank, case.world, case.seq_len, case.cu_seqlens))
         if case.cu_seqlens else case.seq_len // case.world)
    dtype = DTYPES[case.dtype]
    shapes = [(case.batch, s, case.heads, case.head_dim), (case.batch, s, case.kv_heads, case.head_dim),
              (case.batch, s, case.kv_heads, case.head_dim), (case.batch, s, case.heads, case.head_dim)]
    return tuple(torch.randn(*sh, generator=g).to(device=device, dtype=dtype) for sh in shapes)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_pass(attn, inputs: Sequence[torch.Tensor], dout: torch.Tensor | None,
               docs: dict, group: dist.ProcessGroup | None, device: torch.device
               ) -> tuple[float, float, tuple[torch.Tensor, ...]]:
    """One timed call on fresh leaves of `inputs` (q, k, v), after a barrier: (forward seconds,
    backward seconds (0 without dout), (out, q, k, v)), synchronised on CUDA so the clock sees
    the kernels, not their enqueue."""
    q, k, v = (t.detach().requires_grad_(dout is not None) for t in inputs)
    if group is not None:
        dist.barrier(group=group)
    _sync(device)
    t0 = time.perf_counter()
    out = attn(q, k, v, **docs)
    _sync(device)
    t1 = time.perf_counter()
    if dout is not None:
        out.backward(dout)
        _sync(device)
    return t1 - t0, time.perf_counter() - t1, (out, q, k, v)


def measure(case: Case, rank: int, group: dist.ProcessGroup | None,
            device: torch.device | str = "cpu", *, nodes: Sequence[int] | None = None,
            mesh: Mesh | None = None) -> RankMeasurement:
    """Run the case on this rank: warm-up, then `iters` timed iterations (fwd, or fwd+bwd).

    The algorithm's mesh is built from `group` with the node map `nodes` (every rank of the group
    calls this), unless a prebuilt `mesh` is given. Mode `accuracy` measures the errors against
    float64 instead (workers/accuracy.py). With documents (case.cu_seqlens) the shards are dealt
    per document and every call passes them; with a window the attention is built with it."""
    if case.mode == "accuracy":
        from seqpar.workers.accuracy import measure_accuracy

        return measure_accuracy(case, rank, group, device, nodes=nodes, mesh=mesh)
    device = torch.device(device)
    attn = algorithms.build_attention(case.algorithm, causal=case.causal, layout=case.layout,
                                      group=group, mesh=mesh, nodes=nodes, window=case.window,
                                      **case.option_dict)
    q0, k0, v0, dout = local_inputs(case, rank, device)
    docs = {"cu_seqlens": case.cu_seqlens} if case.cu_seqlens else {}
    backward = case.mode == "fwd+bwd"
    meter = MemoryMeter(device)

    def one_iteration() -> tuple[float, float]:
        fwd_s, bwd_s, _ = timed_pass(attn, (q0, k0, v0), dout if backward else None, docs,
                                     group, device)
        return fwd_s, bwd_s

    # memory is measured over one untimed iteration: the last warm-up one, or an extra one after a
    # single warm-up (a process's first iteration also allocates one-time state); over many
    # iterations the resident high-water mark would add up heap fragmentation
    for _ in range(case.warmup - 1 if case.warmup >= 2 else case.warmup):
        one_iteration()
    meter.start()
    one_iteration()
    peak = meter.stop()
    fwd, bwd = [], []
    with algorithms.recording() as ledger:  # the first timed iteration books the ledger
        f, b = one_iteration()
    fwd.append(f)
    bwd.append(b)
    for _ in range(case.iters - 1):
        f, b = one_iteration()
        fwd.append(f)
        bwd.append(b)
    return RankMeasurement(
        rank=rank,
        step_ms=[1e3 * (f + b) for f, b in zip(fwd, bwd, strict=True)],
        fwd_ms=[1e3 * f for f in fwd], bwd_ms=[1e3 * b for b in bwd],
        flops=dict(ledger.flops), ledger=ledger.to_dict(),
        bytes_sent={p: ledger.total(phase=p) for p in ("forward", "backward")},
        peak_mem_bytes=peak, mem_method=meter.method,
    )


def gang_measure(env, case: Case, threads: int | None = None) -> RankMeasurement:
    """`measure` on a LocalGang rank (see platform.localgang), optionally with more threads."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return measure(case, env.rank, env.group(case.world), env.device, mesh=env.mesh)
    finally:
        torch.set_num_threads(before)
