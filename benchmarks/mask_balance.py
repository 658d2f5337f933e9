"""The load imbalance (max / mean visible pairs over ranks) of each layout under random block-sparse
masks, computed from the rules alone (no torch, nothing runs): median and worst over the masks, and
the balanced layout's distance from the optimum (its largest load over a lower bound on any deal's).

    python benchmarks/mask_balance.py                       # 100 masks at P = 8 and 32
    python benchmarks/mask_balance.py --masks 20 --worlds 8 --seq-len 65536
"""

from __future__ import annotations

import argparse
import statistics
import time

from seqpar.rules import blocks, layouts, masks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--masks", type=int, default=100)
    ap.add_argument("--worlds", default="8,32")
    ap.add_argument("--seq-len", type=int, default=262144)
    ap.add_argument("--blocks", type=int, default=64, help="blocks per side of M_blk")
    args = ap.parse_args()
    n, nb = args.seq_len, args.blocks
    print(f"N = {n}, M_blk {nb} x {nb} (block {n // nb}), density 0.05-0.5, causal half the "
          f"masks; {args.masks} masks per P")
    print(f"{'P':>3} {'layout':<11} {'median':>7} {'worst':>7}   balanced: max/bound median, worst")
    for world in (int(w) for w in args.worlds.split(",")):
        start = time.perf_counter()
        by_layout: dict[str, list[float]] = {lay: [] for lay in layouts.LAYOUTS}
        gaps = []
        for seed in range(args.masks):
            density = 0.05 + 0.45 * (seed % 10) / 9
            mask = masks.random_block_sparse(n, n // nb, density, seed, causal=seed % 2 == 1)
            for lay in layouts.LAYOUTS:
                by_layout[lay].append(blocks.imbalance(blocks.rank_pairs(lay, world, n, mask)))
            gaps.append(layouts.balanced_deal(world, n, mask).gap)
        for lay, values in by_layout.items():
            tail = (f"   {statistics.median(gaps):.3f}, {max(gaps):.3f}"
                    if lay == "balanced" else "")
            print(f"{world:>3} {lay:<11} {statistics.median(values):>7.3f} {max(values):>7.3f}"
                  f"{tail}")
        print(f"    ({time.perf_counter() - start:.1f} s for {args.masks} masks x "
              f"{len(layouts.LAYOUTS)} layouts)")


if __name__ == "__main__":
    main()
