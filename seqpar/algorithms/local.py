"""`local`: no parallelism (P = 1). The baseline row of every study, on the same kernels."""

from __future__ import annotations

from seqpar.algorithms import blocks, layouts
from seqpar.algorithms.base import Algorithm, AttnShape
from seqpar.algorithms.options import Options
from seqpar.errors import require


class Local(Algorithm):
    name = "local"
    summary = "no parallelism: one rank attends to the whole sequence"

    def forward(self, q, k, v):
        n = q.shape[1]  # one rank holds every token in order: the plan is cached per (n, relation)
        tasks = layouts.layout_tasks(self.layout, 1, n, 0, 0, self.relation)
        out, lse = blocks.attend_tasks(q, k, v, tasks, self.backend, self.scale)
        return out, (q, k, v, out, lse), tasks

    def backward(self, dout, saved, tasks):
        q, k, v, out, lse = saved
        return blocks.grads_tasks(dout, q, k, v, out, lse, tasks, self.backend, self.scale)

    @classmethod
    def rules(cls, shape: AttnShape, world: int, options: Options) -> None:
        require(world == 1, "world", world, "local runs on one rank only (world must be 1)")

    @classmethod
    def expected_bytes(cls, shape: AttnShape, world: int, options: Options) -> dict[str, int]:
        return {"forward": 0, "backward": 0}
