"""A sliding window over a whole sequence on one CPU rank: the band as one masked rectangle against
`kernels.band_tiles`' row tiles, with full causal beside (forward + backward, CPU time of one thread,
least of --repeats).

    .venv/bin/python benchmarks/band_tiles.py --seq-len 4096
"""

from __future__ import annotations

import argparse
import time

import torch

from seqpar.algorithms import kernels


def _time(q, k, v, dout, mask: str, band=None) -> float:
    start = time.thread_time()
    out, lse = kernels.attend(q, k, v, mask, backend="torch", band=band)
    kernels.attend_backward(dout, q, k, v, out, lse, mask, backend="torch", band=band)
    return time.thread_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    n = args.seq_len
    q, k, v, dout = (torch.randn(1, n, args.heads, args.head_dim) for _ in range(4))
    tile = kernels.BAND_TILE
    causal = min(_time(q, k, v, dout, "causal") for _ in range(args.repeats))
    print(f"N={n} H={args.heads} D={args.head_dim} fp32, one thread; causal {causal:.3f} s")
    for window in (n // 2, n // 8, n // 32):
        band = (1 - window, 1)
        times = {}
        for name, size in (("rectangle", 10**9), ("tiles", tile)):
            kernels.BAND_TILE = size
            times[name] = min(_time(q, k, v, dout, "band", band) for _ in range(args.repeats))
        kernels.BAND_TILE = tile
        print(f"  W={window:>5}: rectangle {times['rectangle']:.3f} s, tiles {times['tiles']:.3f} s"
              f" ({times['rectangle'] / times['tiles']:.1f}x)")


if __name__ == "__main__":
    main()
