"""One rank's attention under a mask: seqpar's block calls (each slice a few calls of the local
kernel, blocks no query sees skipped) against torch's FlexAttention (one compiled kernel over a
`BlockMask` of 128 x 128 blocks), forward + backward, on this machine's device.

    python benchmarks/flex_vs_blocks.py                         # block-sparse, window, causal
    python benchmarks/flex_vs_blocks.py --seq-len 8192 --device cuda --dtype bfloat16

Both compute the same function (checked once against each other); the numbers say which kernel
wins where, for the note. FlexAttention compiles once per mask (not counted: the first call warms
up both). On the CPU FlexAttention has no backward (torch 2.13): forward only there.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from seqpar import algorithms
from seqpar.algorithms import masks


def timed(fn, q, k, v, reps: int) -> float:
    times = []
    backward = q.requires_grad
    for _ in range(reps + 1):
        for t in (q, k, v):
            t.grad = None
        start = time.perf_counter()
        out = fn(q, k, v)
        if backward:
            out.backward(torch.ones_like(out))
        if q.is_cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:]) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    n, h, d = args.seq_len, args.heads, args.head_dim
    dtype = getattr(torch, args.dtype)
    specs = ["block_sparse:128:0.2:0", f"window:{n // 8}", "causal"]
    flex = torch.compile(flex_attention, dynamic=False)
    grad = args.device != "cpu"
    phase = "fwd+bwd" if grad else "fwd"
    print(f"N={n} H={h} D={d} {args.dtype} on {args.device}: {phase} ms (median of {args.reps})")
    for spec in specs:
        mask = masks.parse(spec, n)
        dense = torch.from_numpy(mask.dense()).to(args.device)

        def mask_mod(b, hh, qi, ki, dense=dense):
            return dense[qi, ki]

        block_mask = create_block_mask(mask_mod, None, None, n, n, device=args.device)
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, n, h, d, generator=g).to(args.device, dtype).requires_grad_(grad)
                   for _ in range(3))
        attn = algorithms.build_attention("local", layout="contiguous", mask=mask)

        def ours(q, k, v, attn=attn):
            return attn(q, k, v)

        def theirs(q, k, v, block_mask=block_mask):
            return flex(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                        block_mask=block_mask).transpose(1, 2)

        diff = (ours(q, k, v) - theirs(q, k, v)).abs().max().item()
        a, b = timed(ours, q, k, v, args.reps), timed(theirs, q, k, v, args.reps)
        print(f"  {spec:<22} density {mask.density:.3f}: seqpar blocks {a:8.1f}   "
              f"flex_attention {b:8.1f}   ({b / a:.2f}x; max |diff| {diff:.1e})")


if __name__ == "__main__":
    main()
