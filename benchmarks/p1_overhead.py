"""Every algorithm at P = 1 against `local`, in CPU time: what a ring-family call costs beyond the
kernel (packing, merges, copies) on the same shapes as `seqpar check --bench` (fwd+bwd, causal
zigzag, N = 4096, H = 8, D = 64, fp32), one thread, in this process.

    .venv/bin/python benchmarks/p1_overhead.py
    PYTHONPATH=/tmp/before .venv/bin/python benchmarks/p1_overhead.py   # an older tree

`seqpar check --bench` times wall-clock steps on a gang, which other work on a shared 2-core host
disturbs; this script reads the thread's own CPU time (`time.thread_time`), which waiting for a
core does not add to, and interleaves the algorithms round by round (median of `--rounds`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import seqpar
from seqpar.algorithms import REGISTRY, build_attention


def _step_cpu_s(attn, q, k, v, dout) -> float:
    x = [t.detach().requires_grad_() for t in (q, k, v)]
    t0 = time.thread_time()
    attn(*x).backward(dout)
    return time.thread_time() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(1, args.seq_len, 8, 64, generator=g) for _ in range(4))
    names = ["local", *sorted(n for n in REGISTRY if n != "local")]
    attns = {n: build_attention(n, causal=True, layout="zigzag") for n in names}
    for attn in attns.values():  # warm
        _step_cpu_s(attn, q, k, v, dout)
    times: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(args.rounds):
        for n in names:
            times[n].append(_step_cpu_s(attns[n], q, k, v, dout))
    base = statistics.median(times["local"])
    print(f"seqpar from {seqpar.__file__}; N = {args.seq_len}, median of {args.rounds} "
          f"interleaved rounds, thread CPU time; load {os.getloadavg()[0]:.1f}")
    for n in names:
        ms = statistics.median(times[n]) * 1e3
        print(f"  {n:12} {ms:8.1f} ms  {ms / 1e3 / base:6.3f} x local")


if __name__ == "__main__":
    main()
