"""`double_ring` (LoongTrain Double-Ring-Attention, §4.3, Alg. 2): `usp` with dhp = 1.

The ring of P ranks is split into P / w inner rings of w consecutive ranks (`inner_ring` = w). Each
outer step runs a plain ring inside every inner ring while each rank prefetches, from the previous
inner ring, the K,V its inner ring starts the next outer step with: that inter-node p2p overlaps the
whole inner ring, and all w ranks of a node use their own NIC at once. Bytes equal the ring's.
"""

from __future__ import annotations

from seqpar.algorithms import usp
from seqpar.algorithms.base import AlgorithmSpec

SPEC = AlgorithmSpec(
    "double_ring", "ring split into inner rings of w; outer ring prefetch overlaps each inner ring",
    usp.run, usp.rules, usp.expected_bytes, options={"inner_ring": None}, setup=usp.setup)
