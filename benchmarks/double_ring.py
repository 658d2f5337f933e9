"""Double-Ring-Attention (w = 4) against the plain ring at P = 8 on 2 virtual nodes x 4.

    .venv/bin/python benchmarks/double_ring.py --latency-ms 5 --bandwidth-mb-s 100

Eight local gloo ranks; ranks 0-3 are node 0 and 4-7 node 1 (the mesh's node map), and every
inter-node transfer is made to last at least latency + bytes / bandwidth (`measure(..., links=)`),
intra-node ones run at local speed. The plain ring crosses the nodes at every step (ranks 3 -> 4 and
7 -> 0), so each step waits for the slow link; the double ring crosses only between its two inner
rings (one per node), with the prefetch overlapping a whole inner ring (LoongTrain §4.3). Causal,
zigzag layout, forward + backward; the median step over the timed iterations, slowest rank.
"""

from __future__ import annotations

import argparse

from emulated import inter_link, most_bytes, step_ms

from seqpar.algorithms import comm
from seqpar.case import Case
from seqpar.platform.localgang import LocalGang
from seqpar.workers.measure import measure

NODES = [0, 0, 0, 0, 1, 1, 1, 1]


def _rank(env, case: Case, link: comm.LinkModel | None):
    return measure(case, env.rank, env.group(case.world), env.device, nodes=NODES,
                   links=inter_link(link))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--latency-ms", type=float, default=5.0)
    parser.add_argument("--bandwidth-mb-s", type=float, default=100.0)
    parser.add_argument("--iters", type=int, default=5)
    args = parser.parse_args()
    link = comm.LinkModel(args.latency_ms / 1e3, args.bandwidth_mb_s * 1e6)
    base = Case("ring", 8, "zigzag", True, batch=1, seq_len=args.seq_len, heads=args.heads,
                kv_heads=args.heads, head_dim=args.head_dim, dtype="float32", warmup=1,
                iters=args.iters)
    contenders = {"ring": base,
                  "double_ring w=4": Case(**{**base.__dict__, "algorithm": "double_ring",
                                             "options": (("inner_ring", 4),)})}
    kv_bytes = 2 * base.kv_heads * base.shape.unit(8)
    print(f"P=8 on 2 nodes x 4, causal zigzag, N={args.seq_len} H={args.heads} D={args.head_dim} "
          f"float32; K,V message {kv_bytes / 1e6:.2f} MB")
    print(f"inter-node link: {args.latency_ms} ms + bytes / {args.bandwidth_mb_s} MB/s "
          f"({link.seconds(kv_bytes) * 1e3:.1f} ms per K,V message); intra-node: local speed")
    with LocalGang(8, device="cpu") as gang:
        times: dict[tuple[str, bool], float] = {}
        for emulated in (False, True):
            for name, case in contenders.items():
                results = gang.run(_rank, case, link if emulated else None)
                times[(name, emulated)] = step_ms(results)
                print(f"  {'emulated' if emulated else 'no emulation':>12}  {name:<16} "
                      f"step {times[(name, emulated)]:8.1f} ms   "
                      f"inter-node bytes/rank {most_bytes(results, link='inter'):>9}")
        for emulated in (False, True):
            ratio = times[("ring", emulated)] / times[("double_ring w=4", emulated)]
            print(f"ring / double_ring step time, {'with' if emulated else 'without'} the "
                  f"inter-node link emulation: {ratio:.2f}x")


if __name__ == "__main__":
    main()
