"""`double_ring` (LoongTrain Double-Ring-Attention, §4.3), its rules: usp with dhp = 1."""

from __future__ import annotations

from dataclasses import dataclass

from seqpar.errors import require
from seqpar.rules.algorithms.usp import UspOptions, UspRules
from seqpar.rules.options import Options, divisors, is_int


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


class DoubleRingRules(UspRules):
    name = "double_ring"
    summary = "ring split into inner rings of w; outer ring prefetch overlaps each inner ring"
    Options = DoubleRingOptions
