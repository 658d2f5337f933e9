"""The model on a device other than the CPU: nothing it computes stays behind on the CPU.

The CUDA path cannot run here, so the model is built on torch's `meta` device (shapes and dtypes, no
data): any floating-point tensor that an op produces on the CPU during forward and backward is a
tensor the model forgot to put on its device, the bug that makes a CUDA step fail with "Expected all
tensors to be on the same device" (or run silently on the host). Integer index tensors (a rank's
token positions) are computed on the host and moved, which is allowed.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from seqpar.model import CHECKPOINT_MODES, ModelConfig, Transformer

CFG = ModelConfig(vocab=61, hidden=32, layers=2, heads=4, kv_heads=2, ffn=48)


class HostFloats(TorchDispatchMode):
    """Records every op that produces a floating-point tensor on the CPU."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.is_floating_point():
                self.ops.add(str(func))
        return out


@pytest.mark.parametrize("fused", (False, True))
@pytest.mark.parametrize("mode", CHECKPOINT_MODES)
def test_model_step_keeps_every_float_tensor_on_its_device(mode, fused):
    net = Transformer(CFG, dtype=torch.bfloat16, master_dtype=torch.float32, device="meta",
                      fused_head=fused, checkpoint=mode, head_tiles=(5, 16))
    assert {p.device.type for p in net.parameters()} == {"meta"}
    assert {p.dtype for p in net.parameters()} == {torch.float32}
    tokens = torch.randint(0, CFG.vocab, (2, 17))  # a host batch: the model moves it
    with HostFloats() as seen:
        loss = net.loss(tokens)
        loss.backward()
    assert seen.ops == set(), f"float tensors made on the CPU by {sorted(seen.ops)}"
    assert {p.grad.device.type for p in net.parameters()} == {"meta"}
    assert {p.grad.dtype for p in net.parameters()} == {torch.float32}
