"""The host's speed now: one thread's CPU time for a fixed piece of the work a step does (GEMMs and
an attention pass), so a prediction made for a calibrated host can be held against a trial on a
host whose speed drifts without showing it (a shared VM's neighbours: this project's 2-core VM ran
the same kernel at 31.5 and 55.5 GFLOP/s 80 seconds apart, with nothing else running on it and
no steal in /proc/stat).

    probe_seconds()          # seconds on this thread: the least of PROBE_REPEATS runs

`seqpar calibrate` times it beside the rates it measures (`Cluster.probe_ms`: the least of its
readings, as its rates are the best of theirs); every CPU trial times it on each rank before and
after its timed loop (`timing.iterate`; the metric `noise_probe_ms`); `seqpar plan --validate`
prints the trials' readings over the calibration's beside the error (`planner.plan.Check.speed`:
a reading, not applied: ranks side by side slow the probe as they slow each other).
"""

from __future__ import annotations

import time

import torch

from seqpar.algorithms.kernels import attend, attend_backward

GEMM = 256                  # four GEMMs of GEMM^3
ATTENTION = (1, 256, 4, 32)  # causal forward + backward of (batch, tokens, heads, head dim)
PROBE_REPEATS = 3


def probe_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    """The probe's operands (float32, seeded): a GEMM matrix and the attention's q = k = v."""
    gen = torch.Generator().manual_seed(0)
    return torch.randn(GEMM, GEMM, generator=gen), torch.randn(*ATTENTION, generator=gen)


def probe_work(a: torch.Tensor, q: torch.Tensor) -> None:
    """The probe's fixed piece of a step's work on `probe_inputs()`."""
    for _ in range(4):
        a @ a
    o, lse = attend(q, q, q, "causal")
    attend_backward(torch.ones_like(o), q, q, q, o, lse, "causal")


def probe_seconds(repeats: int = PROBE_REPEATS) -> float:
    """This thread's least CPU seconds over `repeats` runs of the probe (float32, one thread:
    what a CPU rank runs on), after one warm-up run."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, q = probe_inputs()
        probe_work(a, q)
        times = []
        for _ in range(repeats):
            t0 = time.thread_time()
            probe_work(a, q)
            times.append(time.thread_time() - t0)
    finally:
        torch.set_num_threads(threads)
    return min(times)
