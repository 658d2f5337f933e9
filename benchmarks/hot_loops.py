"""CPU-side costs of the ring family's hot loops, per call, one thread: the online-softmax merge of
one block's partial result into the accumulators, the O' that burst's and WallFacer's query ring
rebuild per visiting block, D = rowsum(dO * O), and what a strided K,V costs the CPU flash kernel
against a copy (`blocks.unpack_kv`). Time is the median of `--repeats` calls, memory the peak bytes
allocated inside one call (torch profiler's allocation events, `model.memory.AllocationMeter`).

    .venv/bin/python benchmarks/hot_loops.py                # N = 65536, H = 8, D = 64
    PYTHONPATH=/tmp/before .venv/bin/python benchmarks/hot_loops.py   # an older tree, same script

The script calls the functions by their public names, so running it on an older checkout (e.g.
`git archive <commit> | tar -x -C /tmp/before`) gives the "before" column.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import seqpar
from seqpar.algorithms import blocks, kernels
from seqpar.algorithms.burst import out_for_delta, rowsum_delta
from seqpar.algorithms.softmax_merge import merge_into
from seqpar.model.memory import AllocationMeter


def _measure(fn, repeats: int) -> tuple[float, int]:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    with AllocationMeter() as mem:
        fn()
    return statistics.median(times) * 1e3, mem.peak


def _softmax_rows(dtype: torch.dtype, g: torch.Generator, n: int, h: int, d: int,
                  repeats: int) -> list[tuple[str, float, int]]:
    name = str(dtype).removeprefix("torch.")
    acc, acc_lse = torch.randn(1, n, h, d, generator=g), torch.randn(1, h, n, generator=g)
    part, part_lse = torch.randn(1, n, h, d, generator=g).to(dtype), torch.randn(1, h, n)
    dout = torch.randn(1, n, h, d, generator=g).to(dtype)
    delta = rowsum_delta(dout, part)
    return [(f"merge_into, {name} partial",
             *_measure(lambda: merge_into(acc, acc_lse, part, part_lse), repeats)),
            (f"rowsum_delta, {name}", *_measure(lambda: rowsum_delta(dout, part), repeats)),
            (f"out_for_delta, {name}", *_measure(lambda: out_for_delta(dout, delta), repeats))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=65536)
    parser.add_argument("--kernel-seq-len", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    n, h, d = args.seq_len, 8, 64
    print(f"seqpar from {seqpar.__file__}; N = {n}, H = {h}, D = {d}, one thread")
    rows = [row for dtype in (torch.float32, torch.bfloat16)
            for row in _softmax_rows(dtype, g, n, h, d, args.repeats)]
    m = args.kernel_seq_len
    q, k, v, dout = (torch.randn(1, m, h, d, generator=g) for _ in range(4))
    kv = blocks.pack_kv(k, v)
    views = kv.chunk(2, dim=2)
    for label, (kk, vv) in (("K,V views of the packed message", views), ("K,V dense", (k, v))):
        out, lse = kernels.attend(q, kk, vv, "causal", backend="torch")
        rows.append((f"CPU flash forward N={m}, {label}", *_measure(
            lambda kk=kk, vv=vv: kernels.attend(q, kk, vv, "causal", backend="torch"),
            args.repeats)))
        rows.append((f"CPU flash backward N={m}, {label}", *_measure(
            lambda kk=kk, vv=vv, out=out, lse=lse: kernels.attend_backward(
                dout, q, kk, vv, out, lse, "causal", backend="torch"), args.repeats)))
    rows.append((f"blocks.unpack_kv N={m}", *_measure(lambda: blocks.unpack_kv(kv), args.repeats)))
    width = max(len(r[0]) for r in rows)
    print(f"{'':{width}}  {'ms':>9}  {'peak MB':>9}")
    for label, ms, peak in rows:
        print(f"{label:{width}}  {ms:9.2f}  {peak / 2**20:9.1f}")


if __name__ == "__main__":
    main()
