"""`allgather`, its rules: all-gather K,V forward, reduce-scatter dK,dV backward."""

from __future__ import annotations

from seqpar.rules.algorithms.base import Rules
from seqpar.rules.options import Options
from seqpar.rules.shape import AttnShape


class AllGatherRules(Rules):
    name = "allgather"
    summary = "all-gather K,V; local attention; reduce-scatter dK,dV"

    @classmethod
    def expected_bytes(cls, shape: AttnShape, world: int, options: Options) -> dict[str, int]:
        kv = shape.kv_heads * shape.kv_unit(world)
        grad = shape.kv_heads * shape.kv_grad_unit(world, options)
        return {"forward": (world - 1) * kv, "backward": (world - 1) * grad}
