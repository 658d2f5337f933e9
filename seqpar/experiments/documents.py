"""Packed documents for an experiment: a seeded long-tailed draw of document lengths.

    lengths = draw_lengths(8192, count=16, spread=1.25, seed=0)   # sums to 8192, every length >= 1
    cu = boundaries(lengths)                                      # (0, l0, l0 + l1, ..., 8192)

Real packed pre-training sequences hold a few long documents and many short ones; document
lengths are close to log-normal. A draw takes `count` weights exp(spread * z), z standard normal
from Python's `random.Random(seed)` (the same on every platform and Python version since 3.2), and
deals the sequence in proportion to them (largest remainder, every document at least one token).
`spread` = 0 gives equal documents; at 1.25 the longest of 16 documents is typically 10x the
median one or more (13x for seed 0). The order of the draw is the order in the sequence.
"""

from __future__ import annotations

import math
import random


def draw_lengths(total: int, count: int, spread: float, seed: int) -> tuple[int, ...]:
    """`count` document lengths summing to `total` (>= count), drawn log-normally (see above)."""
    rng = random.Random(seed)
    weights = [math.exp(spread * rng.gauss(0.0, 1.0)) for _ in range(count)]
    free = total - count  # every document has one token; the rest is dealt by weight
    shares = [free * w / sum(weights) for w in weights]
    lengths = [1 + math.floor(s) for s in shares]
    rest = total - sum(lengths)
    by_remainder = sorted(range(count), key=lambda i: (math.floor(shares[i]) - shares[i], i))
    for i in by_remainder[:rest]:
        lengths[i] += 1
    return tuple(lengths)


def boundaries(lengths: tuple[int, ...] | list[int]) -> tuple[int, ...]:
    """Cumulative document boundaries [0, ..., N] (cu_seqlens) of the lengths."""
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return tuple(cu)
