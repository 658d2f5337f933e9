"""Meters of one rank's memory: the peak of a region (`MemoryMeter`) and the bytes autograd saves for
backward (`SavedTensorMeter`).

`MemoryMeter` on CUDA resets the allocator's peak when the region starts and reads three views when
it stops: the allocator's peak (`torch.cuda.max_memory_allocated`: everything allocated at its
highest, what was already held when the region started included: a training step's states), the
peak the allocator reserved from the driver (`max_memory_reserved`: its caching and fragmentation
besides), and the device's own view (`torch.cuda.mem_get_info`: total less free, sampled after each
step: also what no allocator sees, the CUDA context and NCCL's communicator buffers, and any other
process on the GPU). On CPU it reads the process's resident high-water mark (VmHWM, reset through
/proc/self/clear_refs after glibc's malloc_trim has handed freed heap pages back) minus the resident
size just before the region, i.e. the memory the region touched, heap fragmentation included (the
resident size holds the interpreter and torch's libraries: only a difference means anything).
Where the reset is not permitted the method says 'rss-delta-unreset' and the number is an upper
bound.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from dataclasses import dataclass, field

import torch


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


@dataclass(frozen=True)
class Memory:
    """What a MemoryMeter read over its region: the peak, how it was measured, and on CUDA the
    allocator's reserved peak and the device's own view beside it (`views`)."""

    peak_bytes: int
    method: str
    views: dict[str, int] = field(default_factory=dict)


class MemoryMeter:
    """Peak memory between start() and stop(), by the best method the device has (see the module
    docstring); call sample() between steps so the device's view sees each step's end."""

    def __init__(self, device: torch.device):
        self.device = device
        self.method = "cuda-allocator-peak" if device.type == "cuda" else "rss-hwm-delta"
        self._base = 0
        self._device_used = 0

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
            self._device_used = 0
            return
        _release_free_heap()
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
        except OSError:
            self.method = "rss-delta-unreset"
        self._base = _vm_kib("VmRSS") * 1024

    def sample(self) -> None:
        """The device's own view now (CUDA; nothing to do on CPU, whose high-water mark holds)."""
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            self._device_used = max(self._device_used, total - free)

    def stop(self) -> Memory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.sample()
            return Memory(torch.cuda.max_memory_allocated(self.device), self.method, {
                "mem_reserved_bytes": torch.cuda.max_memory_reserved(self.device),
                "mem_device_used_bytes": self._device_used, "mem_start_bytes": self._base})
        return Memory(max(0, _vm_kib("VmHWM") * 1024 - self._base), self.method)


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
