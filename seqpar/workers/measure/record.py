"""A rank's record of one trial (`RankMeasurement`, the Ray rank worker's currency), built one way
(`rank_record`) from what the loop measured, with the attention kernel and the GEMM dtype the rank
ran (a trial whose ranks disagree is unstable: `workers.stability`)."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from seqpar.algorithms.base import DTYPES
from seqpar.algorithms.kernels import kernel_name
from seqpar.case import Case, TrainCase
from seqpar.workers.measure.timing import Loop


@dataclass
class RankMeasurement:
    rank: int
    step_ms: list[float]
    fwd_ms: list[float]
    bwd_ms: list[float]
    flops: dict[str, float]          # attention FLOPs this rank did in one iteration, by phase
    ledger: dict[str, Any]           # one iteration's ledger (entries and flops)
    bytes_sent: dict[str, int]       # one iteration, by phase
    peak_mem_bytes: int              # over the timed iterations (meters.MemoryMeter)
    mem_method: str
    extra: dict[str, Any] = field(default_factory=dict)
    noise: dict[str, Any] = field(default_factory=dict)  # the host over the timed loop (noise.py)
    kernel: str = ""                 # the attention kernel this rank ran (kernels.kernel_name)
    gemm_dtype: str = ""             # the dtype its matmuls ran in
    memory: dict[str, int] = field(default_factory=dict)  # CUDA: reserved peak, device's view

    def median_step_ms(self) -> float:
        return statistics.median(self.step_ms)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def gemm_dtype(dtype: torch.dtype, device: torch.device) -> str:
    """The dtype a float matmul of `dtype` runs in on `device`: float32 on CUDA runs in TF32 where
    torch allows it (`torch.backends.cuda.matmul.allow_tf32`)."""
    if dtype == torch.float32 and device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32:
        return "tf32"
    return str(dtype).removeprefix("torch.")


def kernel_of(case: Case | TrainCase, device: torch.device) -> tuple[str, str]:
    """(attention kernel, GEMM dtype) this rank runs for `case` on `device`."""
    dtype = DTYPES[case.dtype]
    head_dim = case.head_dim if isinstance(case, Case) else case.config().head_dim
    backend = str(case.option_dict.get("backend", "auto"))
    return kernel_name(backend, device, dtype, head_dim=head_dim), gemm_dtype(dtype, device)


def rank_record(case: Case | TrainCase, rank: int, device: torch.device, loop: Loop,
                extra: dict[str, Any] | None = None) -> RankMeasurement:
    """The record of `rank`: per-iteration times (seconds in, milliseconds out), one iteration's
    ledger, FLOPs and bytes by phase, the memory peak and how it was measured, the host's noise,
    and the kernel and GEMM dtype it ran."""
    kernel, gemm = kernel_of(case, device)
    ledger = loop.ledger
    return RankMeasurement(
        rank=rank, step_ms=[1e3 * (f + b) for f, b in zip(loop.fwd_s, loop.bwd_s, strict=True)],
        fwd_ms=[1e3 * f for f in loop.fwd_s], bwd_ms=[1e3 * b for b in loop.bwd_s],
        flops=dict(ledger.flops), ledger=ledger.to_dict(),
        bytes_sent={p: ledger.total(phase=p) for p in ("forward", "backward")},
        peak_mem_bytes=loop.memory.peak_bytes, mem_method=loop.memory.method,
        extra=dict(extra or {}), noise=dict(loop.noise), kernel=kernel, gemm_dtype=gemm,
        memory=dict(loop.memory.views))
