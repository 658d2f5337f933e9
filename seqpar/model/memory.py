"""Host memory a piece of code allocates, from the torch profiler's allocation events.

    with AllocationMeter() as mem:
        loss = net.loss(tokens)
    mem.retained   # bytes allocated inside and still alive at the end: what forward keeps for backward
    mem.peak       # the highest net allocation reached inside

Frees of tensors allocated before the block count as negative: drop references to earlier results
before entering (the caller's job).

Unlike a saved-tensor hook (`workers.bench.SavedTensorMeter`), this sees what checkpointing keeps
outside autograd's saved tensors (a checkpoint's inputs, the fused head's gradients) and what its
own hooks replace; unlike an RSS peak it is exact at small sizes. CPU tensors only.
"""

from __future__ import annotations

from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile


class AllocationMeter:
    def __init__(self) -> None:
        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self.retained = 0
        self.peak = 0

    def __enter__(self) -> AllocationMeter:
        self._prof.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._prof.__exit__(*exc)
        # the raw allocation events, in time order (op-level totals would misplace frees)
        steps = sorted((e.start_ns(), e.nbytes()) for e in self._prof.profiler.kineto_results.events()
                       if e.name() == "[memory]" and e.device_type() == DeviceType.CPU)
        running = 0
        for _, delta in steps:
            running += delta
            self.peak = max(self.peak, running)
        self.retained = running
