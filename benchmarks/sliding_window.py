"""Sliding window W = N/8 against full causal attention: step time, FLOPs and bytes per rank.

    PYTHONPATH=. .venv/bin/python benchmarks/sliding_window.py --seq-len 8192 --world 4

Local gloo ranks on the CPU (float32, forward + backward, median step of the slowest rank over the
timed iterations). Blocks outside every window get no kernel call (`layouts.block_tasks`), so the
FLOPs fall with W; the ring still carries every K,V block (the schedule does not yet skip
transfers: bytes are those of full causal).
"""

from __future__ import annotations

import argparse
import dataclasses

from emulated import step_ms

from seqpar.case import Case
from seqpar.platform.localgang import LocalGang
from seqpar.workers.bench import gang_measure


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--algorithms", default="ring,ulysses")
    ap.add_argument("--layouts", default="zigzag,stripe")
    args = ap.parse_args()
    n, p = args.seq_len, args.world
    print(f"N={n} P={p} H={args.heads} D={args.head_dim} float32 fwd+bwd, CPU gloo; "
          f"window W={n // 8} vs full causal")
    print(f"{'algorithm':<10} {'layout':<8} {'mask':<12} {'step ms':>9} {'GFLOP/rank max':>15} "
          f"{'max/mean':>9} {'MB sent/rank':>13}")
    with LocalGang(p, device="cpu") as gang:
        for algo in args.algorithms.split(","):
            for layout in args.layouts.split(","):
                base = Case(algo, p, layout, True, batch=1, seq_len=n, heads=args.heads,
                            kv_heads=args.heads, head_dim=args.head_dim, dtype="float32",
                            warmup=1, iters=args.iters)
                for window in (None, n // 8):
                    case = dataclasses.replace(base, window=window)
                    res = gang.run(gang_measure, case, size=p)
                    flops = [sum(r.flops.values()) for r in res]
                    sent = max(sum(r.bytes_sent.values()) for r in res)
                    mask = "causal" if window is None else f"W={window}"
                    print(f"{algo:<10} {layout:<8} {mask:<12} {step_ms(res):9.1f} "
                          f"{max(flops) / 1e9:15.2f} {max(flops) / (sum(flops) / p):9.3f} "
                          f"{sent / 1e6:13.2f}", flush=True)


if __name__ == "__main__":
    main()
