"""Model FLOPs of a training step (for MFU, under each named convention) and the FLOPs each
checkpointing mode recomputes: re-exported from `seqpar.rules.flops`, the one place FLOPs are
counted (attention backward = 2.5x forward, the kernels' count; the model's "2x" derived there as
MODEL_BACKWARD_FLOPS)."""

from __future__ import annotations

from seqpar.rules.flops import (
    BACKWARD_FLOPS,
    CONVENTIONS,
    MODEL_BACKWARD_FLOPS,
    attention_model_flops,
    block_params,
    conventions,
    dense_params,
    recomputed_flops,
    recomputed_tokens,
    step_flops,
    visible_pairs,
)

__all__ = ["BACKWARD_FLOPS", "CONVENTIONS", "MODEL_BACKWARD_FLOPS", "attention_model_flops",
           "block_params", "conventions", "dense_params", "recomputed_flops", "recomputed_tokens",
           "step_flops", "visible_pairs"]
