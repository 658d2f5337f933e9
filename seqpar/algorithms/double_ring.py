"""`double_ring` (LoongTrain Double-Ring-Attention, §4.3, Alg. 2): `usp` with dhp = 1.

The ring of P ranks is split into P / w inner rings of w consecutive ranks (`inner_ring` = w). Each
outer step runs a plain ring inside every inner ring while each rank prefetches, from the previous
inner ring and on the outer ring's own communicator, the K,V its inner ring starts the next outer
step with: that inter-node p2p overlaps the whole inner ring, and all w ranks of a node use their
own NIC at once. Bytes equal the ring's. With skip_transfers (`route`) an inner hop travels only
when the block is read later in that inner ring, a prefetch only when it is read in a later one.
"""

from __future__ import annotations

from seqpar.algorithms.usp import Usp
from seqpar.rules.algorithms.double_ring import DoubleRingOptions, DoubleRingRules  # noqa: F401


class DoubleRing(DoubleRingRules, Usp):
    """Usp's forward and backward on the double ring's grid."""
