"""The gradient reduction of replicated model states: summed over the sequence-parallel group,
averaged over the data-parallel group, parameter by parameter while backward still runs.

    sync = GradSync(net.parameters(), sp_group, dp_group, dp)
    sync.begin()     # at the start of a backward (the loss's own backward node calls it)

A post-accumulate-grad hook on every parameter posts an asynchronous all-reduce of its gradient on
the SP group as soon as autograd has written it, so the reduction of late layers overlaps the
backward of early ones; a callback at the end of backward waits for them, reduces over DP, divides
and adds back the gradients earlier backwards left (gradient accumulation). Each gradient is
reduced in place: no flat copy of all gradients, no clone of the earlier ones (the old way held
both: twice the gradient memory, and nothing overlapped).

Every rank posts the same collectives in the same order: gradients are posted in one fixed order
(the parameters' reverse order, which is about the order backward finishes them), and a gradient
that is ready early waits for those before it. A parameter this backward gives no gradient is
skipped on every rank alike.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist


class GradSync:
    def __init__(self, params: Iterable[torch.nn.Parameter], sp_group: dist.ProcessGroup | None,
                 dp_group: dist.ProcessGroup | None, dp: int):
        self.order = list(params)[::-1]
        self.sp_group, self.dp_group, self.dp = sp_group, dp_group, dp
        self._index = {id(p): i for i, p in enumerate(self.order)}
        self._active = False
        self._before: list[torch.Tensor | None] = []
        self._ready: list[bool] = []
        self._posted: list[tuple[torch.Tensor, dist.Work | None]] = []
        self._next = 0
        for p in self.order:
            p.register_post_accumulate_grad_hook(self._on_grad)

    def begin(self) -> None:
        """Park the gradients earlier backwards left, so this backward's arrive alone, and have the
        engine call `finish` when this backward ends."""
        self._before = [p.grad for p in self.order]
        for p in self.order:
            p.grad = None
        self._ready = [False] * len(self.order)
        self._posted, self._next, self._active = [], 0, True
        torch.autograd.Variable._execution_engine.queue_callback(self.finish)

    def _on_grad(self, p: torch.nn.Parameter) -> None:
        if self._active:
            self._ready[self._index[id(p)]] = True
            self._post(until_blocked=True)

    def _post(self, until_blocked: bool) -> None:
        """Post the next gradients in the fixed order: those ready, up to the first that is not
        (`until_blocked`), or all that have one (at the end of backward)."""
        while self._next < len(self.order):
            i = self._next
            if not self._ready[i]:
                if until_blocked:
                    return
                self._next += 1
                continue
            grad = self.order[i].grad
            work = (dist.all_reduce(grad, group=self.sp_group, async_op=True)
                    if self.sp_group is not None else None)
            self._posted.append((grad, work))
            self._next += 1

    @torch.no_grad()
    def finish(self) -> None:
        self._post(until_blocked=False)
        self._active = False
        for _, work in self._posted:
            if work is not None:
                work.wait()
        if self.dp_group is not None:
            works = [dist.all_reduce(g, group=self.dp_group, async_op=True) for g, _ in self._posted]
            for work, (grad, _) in zip(works, self._posted, strict=True):
                work.wait()
                grad.div_(self.dp)
        for p, before in zip(self.order, self._before, strict=True):
            if before is not None:
                p.grad = before if p.grad is None else before.add_(p.grad)
        self._before, self._posted = [], []
