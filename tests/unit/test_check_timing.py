"""`seqpar check` times forward + backward between two device synchronisations (on CUDA the clock
would otherwise measure kernel launches, not kernels)."""

from __future__ import annotations

import time
import types
from dataclasses import dataclass

import torch

from seqpar.case import Case
from seqpar.workers import check


@dataclass
class _Env:
    rank: int = 0
    world: int = 1
    device: str = "cpu"
    mesh = None

    def group(self, size: int):
        return None


def test_rank_run_synchronises_the_device_before_and_after_the_timed_region(monkeypatch):
    events: list[tuple] = []
    monkeypatch.setattr(check, "_sync", lambda device: events.append(("sync", device)))
    monkeypatch.setattr(check, "time", types.SimpleNamespace(
        perf_counter=lambda: events.append(("clock",)) or time.perf_counter()))
    build = check.algorithms.build_attention

    def traced_build(*args, **kwargs):
        attn = build(*args, **kwargs)

        def run(q, k, v):
            events.append(("attention",))
            return attn(q, k, v)
        return run

    monkeypatch.setattr(check.algorithms, "build_attention", traced_build)
    result = check.rank_run(_Env(), Case("local", 1, seq_len=16))
    cpu = torch.device("cpu")
    assert events == [("sync", cpu), ("clock",), ("attention",), ("sync", cpu), ("clock",)]
    assert result.seconds > 0 and result.shards["dq"].shape == (2, 16, 4, 8)
