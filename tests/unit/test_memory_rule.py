"""The one memory rule of every mode (`timing.iterate`, `meters.MemoryMeter`): the peak over the timed
passes only, after a warm pass whose one-time allocations (AdamW's moments, FSDP's lazy init) it
must not count, with the CUDA allocator's reserved peak and the device's own view beside it.

The CUDA branch runs here on a stand-in for torch.cuda's memory functions (as tests/unit's kernel
tests stand in for flash-attn): an allocator whose peak, reservations and free memory the fake
passes move, so what the meter reads can be held against what was allocated when."""

from __future__ import annotations

import random

import pytest
import torch

from seqpar.case import Case, Trial
from seqpar.workers.measure import timing
from seqpar.workers.measure.record import RankMeasurement
from seqpar.workers.metrics import TrialMetrics

GIB = 2**30


class FakeAllocator:
    """torch.cuda's memory statistics of one device, driven by the test."""

    def __init__(self, total: int) -> None:
        self.total, self.allocated, self.peak, self.reserved, self.reserved_peak = total, 0, 0, 0, 0
        self.outside = 0  # what no allocator sees: the CUDA context, NCCL's buffers

    def alloc(self, n: int) -> None:
        self.allocated += n
        self.peak = max(self.peak, self.allocated)
        self.reserved = max(self.reserved, self.allocated + GIB // 8)  # the cache rounds up
        self.reserved_peak = max(self.reserved_peak, self.reserved)

    def free(self, n: int) -> None:
        self.allocated -= n

    def install(self, monkeypatch) -> None:
        def reset(device=None) -> None:
            self.peak, self.reserved_peak = self.allocated, self.reserved

        for name, fn in {"synchronize": lambda device=None: None, "reset_peak_memory_stats": reset,
                         "memory_allocated": lambda device=None: self.allocated,
                         "max_memory_allocated": lambda device=None: self.peak,
                         "max_memory_reserved": lambda device=None: self.reserved_peak,
                         "mem_get_info": lambda device=None: (
                             self.total - self.reserved - self.outside, self.total)}.items():
            monkeypatch.setattr(torch.cuda, name, fn)


def test_cuda_peak_counts_the_timed_passes_not_the_warm_one_and_records_every_view(monkeypatch):
    rng = random.Random()
    state, warm_extra, work = (rng.randrange(1, 8) * GIB for _ in range(3))
    gpu = FakeAllocator(total=80 * GIB)
    gpu.install(monkeypatch)
    passes: list[int] = []

    def one_pass() -> tuple[float, float, None]:
        if not passes:  # the first pass: one-time state that stays, and a one-time workspace
            gpu.alloc(state)
            gpu.alloc(warm_extra)
            gpu.free(warm_extra)
        gpu.alloc(work)  # every pass: its activations, freed at its end
        gpu.outside = GIB // 4 * (1 + len(passes))  # NCCL's buffers grow as groups are used
        gpu.free(work)
        passes.append(1)
        return 0.001, 0.002, None

    loop = timing.iterate(one_pass, warmup=1, iters=3, device=torch.device("cuda", 0))
    assert len(passes) == 4  # one warm pass, three timed ones
    mem = loop.memory
    assert mem.method == "cuda-allocator-peak"
    assert mem.peak_bytes == state + work  # the held state and the pass; not the warm workspace
    assert mem.views["mem_start_bytes"] == state
    assert mem.views["mem_reserved_bytes"] == state + work + GIB // 8 + (
        max(0, warm_extra - work))  # the cache keeps what the warm pass reserved
    assert mem.views["mem_device_used_bytes"] == gpu.reserved + GIB // 4 * 4  # after the last


def test_a_warmup_of_zero_still_warms_once_before_the_peak(monkeypatch):
    gpu = FakeAllocator(total=80 * GIB)
    gpu.install(monkeypatch)
    seen: list[int] = []

    def one_pass() -> tuple[float, float, None]:
        if not seen:
            gpu.alloc(GIB)  # first-call state
        gpu.alloc(100)
        gpu.free(100)
        seen.append(1)
        return 0.0, 0.0, None

    loop = timing.iterate(one_pass, warmup=0, iters=2, device=torch.device("cuda", 0))
    assert len(seen) == 3 and loop.memory.peak_bytes == GIB + 100


def test_cpu_peak_leaves_out_what_the_first_step_made_for_good():
    """A first training step creates AdamW's moments (here 96 MiB kept for the rest of the run);
    the peak over the timed steps sees only what a step itself touches (8 MiB). Training's old
    rule metered its first step when warmup was 1, moments and all."""
    kept: list[torch.Tensor] = []

    def step() -> tuple[float, float, None]:
        if not kept:
            kept.append(torch.ones(96 * 2**20 // 4))
        scratch = torch.ones(8 * 2**20 // 4)  # faulted in: it shows in the resident peak
        del scratch
        return 0.0, 0.0, None

    loop = timing.iterate(step, warmup=1, iters=2, device=torch.device("cpu"))
    if loop.memory.method == "rss-delta-unreset":
        pytest.skip("this kernel refuses to reset the resident high-water mark")
    assert loop.memory.peak_bytes < 48 * 2**20, loop.memory  # far below the 96 MiB moments


def test_the_trial_reports_the_worst_ranks_memory_views():
    def rank(r: int, reserved: int) -> RankMeasurement:
        return RankMeasurement(r, [1.0, 1.0], [0.5, 0.5], [0.5, 0.5], {"forward": 1.0},
                               {"entries": [], "flops": {}}, {"forward": 0}, 100 + r,
                               "cuda-allocator-peak", memory={"mem_reserved_bytes": reserved,
                                                              "mem_device_used_bytes": 2 * reserved})

    m = TrialMetrics.of(Trial(Case("ring", world=2), "g"), [rank(0, 700), rank(1, 500)])
    assert (m["peak_mem_bytes"], m["mem_reserved_bytes"], m["mem_device_used_bytes"]) == (
        101, 700, 1400)
