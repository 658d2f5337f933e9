"""Host memory a piece of code allocates, from the torch profiler's allocation events.

    with AllocationMeter() as mem:
        loss = net.loss(tokens)
    mem.retained   # bytes allocated inside and still alive at the end: what forward keeps for backward
    mem.peak       # the highest net allocation reached inside

Frees of tensors allocated before the block count as negative: drop references to earlier results
before entering (the caller's job).

Unlike a saved-tensor hook (`workers.bench.SavedTensorMeter`), this sees what checkpointing keeps
outside autograd's saved tensors (a checkpoint's inputs, the fused head's gradients) and what its
own hooks replace; unlike an RSS peak it is exact at small sizes. On a CUDA device it reads the
caching allocator instead (bytes allocated at the end minus at the start; the allocator's peak).

`state_bytes(net, optimizer)`: the bytes this rank holds for model states — parameters, gradients
and optimizer moments (a sharded parameter counts its local shard).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from seqpar.rules.memory import (  # noqa: F401 (the predictions: one place, the rules floor)
    ELEM,
    AttentionHeld,
    TrainPolicy,
    block_elems,
    predicted_activations,
    predicted_states,
)


class AllocationMeter:
    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self._prof = (None if self.device.type == "cuda"
                      else profile(activities=[ProfilerActivity.CPU], profile_memory=True))
        self.retained = 0
        self.peak = 0
        self._base = 0

    def __enter__(self) -> AllocationMeter:
        if self._prof is None:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
        else:
            self._prof.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._prof is None:
            torch.cuda.synchronize(self.device)
            self.retained = torch.cuda.memory_allocated(self.device) - self._base
            self.peak = torch.cuda.max_memory_allocated(self.device) - self._base
            return
        self._prof.__exit__(*exc)
        # the raw allocation events, in time order (op-level totals would misplace frees)
        steps = sorted((e.start_ns(), e.nbytes()) for e in self._prof.profiler.kineto_results.events()
                       if e.name() == "[memory]" and e.device_type() == DeviceType.CPU)
        running = 0
        for _, delta in steps:
            running += delta
            self.peak = max(self.peak, running)
        self.retained = running


def _nbytes(t: torch.Tensor) -> int:
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.numel() * local.element_size()


def state_breakdown(net: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
    """Bytes this rank holds for parameters, gradients and optimizer states (local shards)."""
    params = list(net.parameters())
    out = {"params": sum(_nbytes(p) for p in params),
           "grads": sum(_nbytes(p.grad) for p in params if p.grad is not None),
           "optimizer": 0}
    if optimizer is not None:
        local = getattr(optimizer, "optim", optimizer)  # ZeRO-1's: the moments of this rank's share
        out["optimizer"] = sum(_nbytes(v) for state in local.state.values()
                               for v in state.values() if isinstance(v, torch.Tensor))
    return out


def state_bytes(net: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> int:
    """The bytes this rank holds for model states: parameters, gradients and optimizer moments."""
    return sum(state_breakdown(net, optimizer).values())
