"""Each kernel's entry points by name (`capability.KERNELS`): dense blocks, band blocks through a
window, packed sequences. flash-attn and torch's own flash kernel share one calling convention
(`flash.py`, `torch_flash.py`), so bands and varlen calls run on whichever of the two the call has
(`capability.window_kernel`); the others run dense blocks only."""

from __future__ import annotations

from seqpar.algorithms.kernels import cudnn, torch_flash
from seqpar.algorithms.kernels.aten import aten_backward, aten_forward
from seqpar.algorithms.kernels.flash import (
    flash_backward,
    flash_forward,
    flash_varlen_backward,
    flash_varlen_forward,
)
from seqpar.algorithms.kernels.math_kernel import math_backward, math_forward

# (q, k, v, causal, scale) -> (out, lse (B, H, Sq))
FORWARD = {"flash-attn": flash_forward, "torch-flash": torch_flash.forward,
           "torch-cudnn": cudnn.forward, "torch-efficient": aten_forward,
           "torch-cpu-flash": aten_forward, "math": math_forward}
# (dout, q, k, v, out, lse, causal, scale) -> (dq, dk, dv)
BACKWARD = {"flash-attn": flash_backward, "torch-flash": torch_flash.backward,
            "torch-cudnn": cudnn.backward, "torch-efficient": aten_backward,
            "torch-cpu-flash": aten_backward, "math": math_backward}
# the FlashAttention-2 kernels: a window (left, right) and packed sequences
WINDOW_FORWARD = {"flash-attn": flash_forward, "torch-flash": torch_flash.forward}
WINDOW_BACKWARD = {"flash-attn": flash_backward, "torch-flash": torch_flash.backward}
VARLEN_FORWARD = {"flash-attn": flash_varlen_forward, "torch-flash": torch_flash.varlen_forward}
VARLEN_BACKWARD = {"flash-attn": flash_varlen_backward, "torch-flash": torch_flash.varlen_backward}
