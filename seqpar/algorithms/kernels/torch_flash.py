"""torch's own FlashAttention-2 (`aten._flash_attention_forward` / `_backward`, the kernel under
`scaled_dot_product_attention` and torch's context-parallel ring on CUDA): the best kernel a CUDA
machine has without the flash-attn package, with everything seqpar needs from flash-attn itself —
the lse, native GQA (K,V with fewer heads, never expanded), a window (left, right) that computes a
band block, and packed sequences (varlen) that run a block's documents in one call.

Same calling convention as `flash.py` (bshd inputs, (out, lse (B, H, Sq) float32) or, packed,
(out (T, H, D), lse (H, T) float32)), so `engines.py` hands either to the same callers. The kernel
wants a head dim that is a multiple of 8 ("ensured by padding" in torch's own wrapper): inputs are
padded and outputs sliced back, with the scale passed explicitly so the padding does not change it.
With dropout 0 the kernel never reads the random-state tensors; the backward gets empty ones.
"""

from __future__ import annotations

import torch

from seqpar.algorithms.kernels.binding import pad_head_dim
from seqpar.algorithms.kernels.tensors import contiguous, one_width_backward, one_width_forward

NO_WINDOW = (-1, -1)


def _unused_rng(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The (philox seed, offset) arguments, shaped as the forward returns them (read only under
    dropout)."""
    return (torch.empty(2, dtype=torch.uint64, device=device),
            torch.empty((), dtype=torch.uint64, device=device))


def _window(window: tuple[int, int]) -> dict[str, int | None]:
    left, right = window
    return {"window_size_left": None if left < 0 else left,
            "window_size_right": None if right < 0 else right}


def _forward(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, window):
    d = q.shape[-1]
    out, lse, *_ = torch.ops.aten._flash_attention_forward(
        pad_head_dim(q), pad_head_dim(k), pad_head_dim(v), cu_q, cu_k, max_q, max_k, 0.0,
        causal, False, scale=scale, **_window(window))
    return out.narrow(-1, 0, d), lse


def _backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale, window):
    d = q.shape[-1]
    seed, offset = _unused_rng(q.device)
    grads = torch.ops.aten._flash_attention_backward(
        pad_head_dim(dout), pad_head_dim(q), pad_head_dim(k), pad_head_dim(v), pad_head_dim(out),
        contiguous(lse.float()), cu_q, cu_k, max_q, max_k, 0.0, causal, seed, offset, scale=scale,
        **_window(window))
    return tuple(g.narrow(-1, 0, d) for g in grads)


@one_width_forward
def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
            window: tuple[int, int] = NO_WINDOW) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (B, Sq, H, D), lse (B, H, Sq) float32) of one dense block; K,V may have fewer heads."""
    _check_square(q, k, causal)
    return _forward(q, k, v, None, None, q.shape[1], k.shape[1], causal, scale, window)


@one_width_backward
def backward(dout, q, k, v, out, lse, causal, scale, window=NO_WINDOW):
    """(dq, dk, dv) of one dense block given the final out and lse (B, H, Sq)."""
    _check_square(q, k, causal)
    return _backward(dout, q, k, v, out, lse, None, None, q.shape[1], k.shape[1], causal, scale,
                     window)


@one_width_forward
def varlen_forward(q, k, v, seqs, causal, window, scale):
    """(out (Tq, H, D), lse (H, Tq) float32) of packed sequences (`flash.Varlen`)."""
    return _forward(q, k, v, seqs.cu_q, seqs.cu_k, seqs.max_q, seqs.max_k, causal, scale, window)


@one_width_backward
def varlen_backward(dout, q, k, v, out, lse, seqs, causal, window, scale):
    """(dq, dk, dv) of packed sequences given the final out and lse (H, Tq)."""
    return _backward(dout, q, k, v, out, lse, seqs.cu_q, seqs.cu_k, seqs.max_q, seqs.max_k,
                     causal, scale, window)


def _check_square(q, k, causal):
    """Like flash-attn, the kernel aligns a causal mask bottom-right when Sq != Sk; seqpar's causal
    is top-left. They agree on square blocks, the only causal blocks layouts plan."""
    if causal and q.shape[1] != k.shape[1]:
        raise ValueError(f"torch flash kernel: a causal block must be square, got Sq={q.shape[1]} "
                         f"Sk={k.shape[1]}")
