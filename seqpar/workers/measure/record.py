"""A rank's record of one trial (`RankMeasurement`, the Ray rank worker's currency), built one way
(`rank_record`) from what the loop measured."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from seqpar.algorithms.ledger import Ledger


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
    noise: dict[str, Any] = field(default_factory=dict)  # the host over the timed loop (noise.py)

    def median_step_ms(self) -> float:
        return statistics.median(self.step_ms)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def rank_record(rank: int, fwd_s: Sequence[float], bwd_s: Sequence[float], ledger: Ledger,
                peak_mem_bytes: int, mem_method: str, extra: dict[str, Any] | None = None,
                noise: dict[str, Any] | None = None) -> RankMeasurement:
    """The record of `rank`: per-iteration times (seconds in, milliseconds out), one iteration's
    ledger, FLOPs and bytes by phase, the memory peak and how it was measured, the host's noise."""
    return RankMeasurement(
        rank=rank, step_ms=[1e3 * (f + b) for f, b in zip(fwd_s, bwd_s, strict=True)],
        fwd_ms=[1e3 * f for f in fwd_s], bwd_ms=[1e3 * b for b in bwd_s],
        flops=dict(ledger.flops), ledger=ledger.to_dict(),
        bytes_sent={p: ledger.total(phase=p) for p in ("forward", "backward")},
        peak_mem_bytes=peak_mem_bytes, mem_method=mem_method, extra=dict(extra or {}),
        noise=dict(noise or {}))


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation; a single value is every percentile."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)
