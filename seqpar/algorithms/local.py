"""`local`: no parallelism (P = 1). The baseline row of every study, on the same kernels."""

from __future__ import annotations

from seqpar.algorithms import blocks, layouts
from seqpar.algorithms.base import Algorithm
from seqpar.rules.algorithms.local import LocalRules


class Local(LocalRules, Algorithm):
    takes_sinks = True

    def forward(self, q, k, v):
        n = q.shape[1]  # one rank holds every token in order: the plan is cached per (n, relation)
        tasks = layouts.layout_tasks(self.layout, 1, n, 0, 0, self.relation)
        out, lse = blocks.attend_tasks(q, k, v, tasks, self.backend, self.scale)
        out = self.sink(out, lse)
        return out, (q, k, v, out, lse), tasks

    def backward(self, dout, saved, tasks):
        q, k, v, out, lse = saved
        dout, dsinks = self.unsink(dout, out, lse)
        return (*blocks.grads_tasks(dout, q, k, v, out, lse, tasks, self.backend, self.scale),
                dsinks)
