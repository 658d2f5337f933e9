"""attend / attend_backward: one block of attention with its lse, by mask, on the kernel that runs
(`capability.kernel_of`: the backend resolved for the device, dtype and head dim)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from seqpar.algorithms.kernels.bands import (
    band_dense_backward,
    band_forward,
    band_tiled_backward,
    band_tiles,
)
from seqpar.algorithms.kernels.capability import kernel_of, window_kernel
from seqpar.algorithms.kernels.engines import BACKWARD, FORWARD, WINDOW_BACKWARD
from seqpar.algorithms.kernels.flash import flash_window
from seqpar.algorithms.kernels.flops import book_flops
from seqpar.algorithms.kernels.tensors import acc_dtype, default_scale, pad_rows, seq_rows

MASKS = ("full", "causal", "shifted")  # the masks without parameters; plus "band" (band=(a, b))


def _record(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: str,
            band: tuple[int, int] | None, backward: bool) -> None:
    b, sq, h, d = q.shape
    book_flops(b, sq, k.shape[1], h, d, mask, band, backward=backward, v_dim=v.shape[-1])


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: str = "full", *,
    backend: str = "auto", scale: float | None = None, band: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of q over (k, v) under `mask` (band: the offsets of mask 'band'); (out, lse)."""
    scale = default_scale(scale, q.shape[-1])
    kernel = kernel_of(backend, q.device, q.dtype, head_dim=q.shape[-1])
    _record(q, k, v, mask, band, backward=False)
    if mask == "band":
        return band_forward(q, k, v, band, kernel, scale)
    return _forward(q, k, v, mask, kernel, scale)


def _forward(q, k, v, mask, kernel, scale):
    if mask == "shifted":
        return _shifted_forward(q, k, v, kernel, scale)
    return FORWARD[kernel](q, k, v, mask == "causal", scale)


def _shifted_forward(q, k, v, kernel, scale):
    """Query i sees keys j < i: query rows 1.. against keys ..-1 under a causal mask."""
    b, s, h, d = q.shape
    if s == 1:
        lse = torch.full((b, h, s), float("-inf"), dtype=acc_dtype(q.dtype), device=q.device)
        return q.new_zeros(*q.shape[:3], v.shape[-1]), lse
    o, lse_rest = _forward(seq_rows(q, 1), seq_rows(k, 0, s - 1), seq_rows(v, 0, s - 1), "causal",
                           kernel, scale)
    return pad_rows(o, 1, 0), F.pad(lse_rest.to(acc_dtype(q.dtype)), (1, 0), value=float("-inf"))


def attend_backward(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    out: torch.Tensor, lse: torch.Tensor, mask: str = "full", *,
    backend: str = "auto", scale: float | None = None, band: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dq, dk, dv) of one block, given the final (out, lse) of the full attention.

    With the global out and lse, a block's probabilities are the globally normalised ones, so the
    gradients of all blocks simply add up (the ring-attention backward identity).
    """
    scale = default_scale(scale, q.shape[-1])
    kernel = kernel_of(backend, q.device, q.dtype, head_dim=q.shape[-1])
    _record(q, k, v, mask, band, backward=True)
    if mask == "band":
        sq, sk = q.shape[1], k.shape[1]
        windowed = window_kernel(kernel, q.device, q.dtype, q.shape[-1])
        if windowed is not None:
            return WINDOW_BACKWARD[windowed](dout, q, k, v, out, lse, False, scale,
                                             window=flash_window(sq, sk, band))
        tiles = band_tiles(sq, sk, band)
        if len(tiles) == 1:
            return band_dense_backward(dout, q, k, v, out, lse, band, kernel, scale)
        return band_tiled_backward(dout, q, k, v, out, lse, tiles, kernel, scale)
    return _backward(dout, q, k, v, out, lse, mask, kernel, scale)


def _backward(dout, q, k, v, out, lse, mask, kernel, scale):
    if mask == "shifted":
        return _shifted_backward(dout, q, k, v, out, lse, kernel, scale)
    return BACKWARD[kernel](dout, q, k, v, out, lse, mask == "causal", scale)


def _shifted_backward(dout, q, k, v, out, lse, kernel, scale):
    s = q.shape[1]
    if s == 1:
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    gq, gk, gv = _backward(seq_rows(dout, 1), seq_rows(q, 1), seq_rows(k, 0, s - 1),
                           seq_rows(v, 0, s - 1), seq_rows(out, 1), lse.narrow(2, 1, s - 1),
                           "causal", kernel, scale)
    return pad_rows(gq, 1, 0), pad_rows(gk, 0, 1), pad_rows(gv, 0, 1)
