"""cuDNN's fused attention through torch (`aten._scaled_dot_product_cudnn_attention` / `_backward`):
the backend 'cudnn', dense full and causal blocks with their lse.

Inputs are bshd; the kernel takes bhsd views of them (no copy). torch passes cuDNN one head count
for q, k and v on this path, so GQA's K,V are expanded to the query heads here (and their gradients
summed back); bands and packed sequences do not go through cuDNN (`engines.py` gives them torch's
flash kernel). The lse comes back as (B, H, Sq[, 1]) float32; the backward takes (B, H, Sq).
"""

from __future__ import annotations

import torch

from seqpar.algorithms.kernels.tensors import (
    contiguous,
    expand_kv,
    one_width_backward,
    one_width_forward,
    reduce_kv,
)


def _unused_rng(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(philox seed, offset) as the forward returns them (read only under dropout)."""
    return (torch.empty((), dtype=torch.long, device=device),
            torch.empty((), dtype=torch.long, device=device))


def _bhsd(*ts: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(contiguous(t).transpose(1, 2) for t in ts)


@one_width_forward
def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
            scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (B, Sq, H, D), lse (B, H, Sq) float32) of one dense block."""
    b, sq, h, _ = q.shape
    qt, kt, vt = _bhsd(q, expand_kv(k, h), expand_kv(v, h))
    out, lse, *_ = torch.ops.aten._scaled_dot_product_cudnn_attention(
        qt, kt, vt, None, True, 0.0, causal, False, scale=scale)
    return out.transpose(1, 2), lse.reshape(b, h, sq).float()


@one_width_backward
def backward(dout, q, k, v, out, lse, causal, scale):
    """(dq, dk, dv) of one dense block given the final out and lse (B, H, Sq)."""
    h, hkv = q.shape[2], k.shape[2]
    qt, kt, vt, ot, dot = _bhsd(q, expand_kv(k, h), expand_kv(v, h), out, dout)
    seed, offset = _unused_rng(q.device)
    dq, dk, dv = torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
        dot, qt, kt, vt, ot, contiguous(lse.float()), seed, offset, None, None, None,
        q.shape[1], k.shape[1], 0.0, causal, scale=scale)
    dq, dk, dv = (t.transpose(1, 2) for t in (dq, dk, dv))
    return dq, reduce_kv(dk, hkv), reduce_kv(dv, hkv)
