"""The host's cost of issuing one operation on this machine (`Cluster.dispatch_us`): a training
step of the test decoder so small that its FLOPs and bytes are nothing (16 tokens, one rank,
the local attention), timed in the thread's own CPU time (the least of its repeats: other
processes on a busy machine do not count), over the operations that launch work in it, counted by
the same rule as `rules.ops`' table (`workers.measure.opcount`; the attention kernel's own
operations counted too: on a CPU they are dispatches like the rest). The mix is the runner's own:
forward operations issued from Python with autograd recording, backward ones from the autograd
engine, AdamW's. A few seconds."""

from __future__ import annotations

import statistics
import time

import torch

from seqpar.case import TrainCase
from seqpar.workers.measure.opcount import OpCounter
from seqpar.workers.measure.train import build

TOKENS = 16
REPEATS = 30


def dispatch_seconds(repeats: int = REPEATS) -> tuple[float, int]:
    """(host seconds per launching operation, operations a step) of the tiny step on one
    thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        case = TrainCase(sp=1, algorithm="local", layout="contiguous", seq_len=TOKENS, iters=1,
                         warmup=0)
        net = build(case, None)
        opt = net.optimizer(1e-3)
        tokens = torch.randint(0, net.cfg.vocab, (1, TOKENS + 1),
                               generator=torch.Generator().manual_seed(0))

        def once() -> None:
            net.loss(tokens).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        for _ in range(3):
            once()
        with OpCounter() as counter:
            once()
        ops = sum(t.ops + t.kernel_ops + t.collectives + t.messages
                  for t in counter.tallies.values())
        times = []
        for _ in range(repeats):
            start = time.thread_time()
            once()
            times.append(time.thread_time() - start)
    finally:
        torch.set_num_threads(threads)
    least = min(times)
    spread = statistics.median(times) / least if least > 0 else 1.0
    assert spread < 10, f"the tiny step's CPU time varies {spread:.1f}x: too noisy to measure"
    return least / ops, ops
