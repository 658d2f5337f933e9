"""Memory of the accuracy trial's float64 reference (`workers/measure/reference.py`) in blocks of
query rows against one block of all N rows (the O(N^2) form it replaced), on this machine's CPU.

    PYTHONPATH=. .venv/bin/python benchmarks/reference_memory.py --seq-len 16384 --documents

Each form runs in a fresh process (the resident high-water mark is per process): peak = VmHWM
after the call minus VmRSS before it (reset through /proc/self/clear_refs after malloc_trim), one
head of 64 dims, batch 1, float64. `--documents`: three documents and a window of N/4 (an explicit
mask); without it plain causal. The outputs of the two forms are compared to 1e-12.
"""

from __future__ import annotations

import argparse
import ctypes
import subprocess
import sys
import time

import torch

from seqpar.case import Case
from seqpar.workers.measure.reference import query_block, reference


def _kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _case(n: int, documents: bool) -> Case:
    return Case("local", 1, batch=1, seq_len=n, heads=1, kv_heads=1, head_dim=64,
                cu_seqlens=(0, n // 3, n) if documents else (),
                window=n // 4 if documents else None)


def one(n: int, documents: bool, block: int | None, save: str) -> None:
    """In this process: the reference with `block` rows (None: the default), its peak and time."""
    torch.set_num_threads(1)
    case = _case(n, documents)
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = _kib("VmRSS")
    t0 = time.perf_counter()
    ref = reference(case, block=block)
    seconds = time.perf_counter() - t0
    peak = _kib("VmHWM") - base
    torch.save(ref, save)
    rows = query_block(case) if block is None else block
    print(f"{rows:6d} rows per block: peak {peak / 2**20:7.0f} MiB "
          f"({peak / (8 * n * n):.2f} x 8 N^2 bytes), {seconds:5.1f} s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq-len", type=int, default=16384)
    ap.add_argument("--documents", action="store_true")
    ap.add_argument("--block", type=int, default=-1, help=argparse.SUPPRESS)  # a child's form
    ap.add_argument("--save", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.save:
        one(args.seq_len, args.documents, None if args.block < 0 else args.block, args.save)
        return
    print(f"N = {args.seq_len}, {'3 documents, window N/4' if args.documents else 'causal'}")
    saved = []
    for block in (-1, args.seq_len):
        path = f"/tmp/reference_memory_{block}.pt"
        subprocess.run([sys.executable, __file__, "--seq-len", str(args.seq_len), "--block",
                        str(block), "--save", path] + (["--documents"] if args.documents else []),
                       check=True)
        saved.append(torch.load(path))
    worst = max(float((saved[0][n] - saved[1][n]).abs().max()) for n in saved[0])
    print(f"largest difference between the two forms: {worst:.1e}")


if __name__ == "__main__":
    main()
