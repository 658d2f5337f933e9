"""Model FLOPs of a training step (for MFU) and the FLOPs each checkpointing mode recomputes:
re-exported from `seqpar.rules.flops`, the one place FLOPs are counted (attention backward = 2.5x
forward, the kernels' count; the dense-layer "2x" derived there as MODEL_BACKWARD_FLOPS)."""

from __future__ import annotations

from seqpar.rules.flops import (
    BACKWARD_FLOPS,
    CONVENTIONS,
    MODEL_BACKWARD_FLOPS,
    block_params,
    dense_params,
    recomputed_flops,
    step_flops,
)

__all__ = ["BACKWARD_FLOPS", "CONVENTIONS", "MODEL_BACKWARD_FLOPS", "block_params",
           "dense_params", "recomputed_flops", "step_flops"]
