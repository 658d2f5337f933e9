"""`double_ring` (LoongTrain Double-Ring-Attention, §4.3, Alg. 2): `usp` with dhp = 1.

The ring of P ranks is split into P / w inner rings of w consecutive ranks (`inner_ring` = w). Each
outer step runs a plain ring inside every inner ring while each rank prefetches, from the previous
inner ring and on the outer ring's own communicator, the K,V its inner ring starts the next outer
step with: that inter-node p2p overlaps the whole inner ring, and all w ranks of a node use their
own NIC at once. Bytes equal the ring's. With skip_transfers (`route`) an inner hop travels only
when the block is read later in that inner ring, a prefetch only when it is read in a later one.
"""

from __future__ import annotations

from dataclasses import dataclass

from seqpar.algorithms.options import Options, divisors, is_int
from seqpar.algorithms.usp import Usp, UspOptions
from seqpar.errors import require


@dataclass(frozen=True)
class DoubleRingOptions(Options):
    inner_ring: int | None = None     # inner ring size w (divides P); default P: the plain ring

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.inner_ring is None or (is_int(self.inner_ring) and self.inner_ring >= 1),
                "inner_ring", self.inner_ring, "must be a positive integer")

    def resolved(self, world: int) -> tuple[int, int, str, int]:
        return self.as_usp().resolved(world)

    def as_usp(self) -> UspOptions:
        return UspOptions(self.backend, self.scale, self.grad_dtype, self.skip_transfers,
                          inner_ring=self.inner_ring)

    def check(self, world: int) -> None:
        self.resolved(world)

    @classmethod
    def space(cls, world: int) -> list[Options]:
        return [cls(inner_ring=w) for w in divisors(world)]


class DoubleRing(Usp):
    name = "double_ring"
    summary = "ring split into inner rings of w; outer ring prefetch overlaps each inner ring"
    Options = DoubleRingOptions
