"""`local`: no parallelism (P = 1), its rules."""

from __future__ import annotations

from seqpar.errors import require
from seqpar.rules.algorithms.base import Rules
from seqpar.rules.options import Options
from seqpar.rules.shape import AttnShape


class LocalRules(Rules):
    name = "local"
    summary = "no parallelism: one rank attends to the whole sequence"

    @classmethod
    def rules(cls, shape: AttnShape, world: int, options: Options) -> None:
        require(world == 1, "world", world, "local runs on one rank only (world must be 1)")

    @classmethod
    def expected_bytes(cls, shape: AttnShape, world: int, options: Options) -> dict[str, int]:
        return {"forward": 0, "backward": 0}
