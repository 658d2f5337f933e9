"""Causal work per rank with packed documents: per-document zigzag (seqpar's zigzag with
cu_seqlens) against plain per-sequence zigzag, stripe and contiguous.

    PYTHONPATH=. .venv/bin/python benchmarks/document_balance.py

Eight documents whose lengths span 16x (1, 2, 3, 4, 6, 8, 12, 16 units, shuffled), causal inside
each document. The work of a rank is its visible (query, key) pairs (`layouts.Relation.pairs`:
FLOPs are 4*B*H*D times that), computed analytically; max/mean over ranks is the load imbalance
(1.0 = ideal). Windows W add a sliding window inside each document.
"""

from __future__ import annotations

import argparse

import torch

from seqpar.algorithms import layouts

UNITS = (6, 1, 16, 3, 8, 2, 12, 4)  # 16x between the longest and the shortest document


def documents(unit: int) -> tuple[int, ...]:
    cu = [0]
    for u in UNITS:
        cu.append(cu[-1] + u * unit)
    return tuple(cu)


def rank_pairs(layout: str, world: int, cu: tuple[int, ...], per_document: bool,
               window: int | None = None) -> list[int]:
    """Visible pairs of each rank's queries over all keys (documents, causal, window)."""
    n = cu[-1]
    rel = layouts.Relation(True, cu, window)
    keys = torch.arange(n)
    return [rel.pairs(layouts.positions(layout, r, world, n, cu if per_document else None), keys)
            for r in range(world)]


def imbalance(pairs: list[int]) -> float:
    return max(pairs) / (sum(pairs) / len(pairs))


def table(unit: int, worlds=(4, 8), window: int | None = None) -> list[dict]:
    cu = documents(unit)
    rows = []
    for world in worlds:
        for name, layout, per_doc in (("zigzag per document", "zigzag", True),
                                      ("zigzag per sequence", "zigzag", False),
                                      ("stripe", "stripe", True),
                                      ("contiguous", "contiguous", True)):
            rows.append({"P": world, "dispatch": name,
                         "max/mean": imbalance(rank_pairs(layout, world, cu, per_doc, window))})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--unit", type=int, default=256, help="tokens per length unit (N = 52 units)")
    ap.add_argument("--window", type=int, default=None)
    args = ap.parse_args()
    print(f"N = {documents(args.unit)[-1]}, documents {[u * args.unit for u in UNITS]}, "
          f"window {args.window}")
    print(f"{'P':>2}  {'dispatch':<22} max/mean")
    for row in table(args.unit, window=args.window):
        print(f"{row['P']:>2}  {row['dispatch']:<22} {row['max/mean']:.4f}")


if __name__ == "__main__":
    main()
