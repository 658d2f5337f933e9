"""The flash backend: flash-attn 2's dense and packed-sequence (varlen) calls, and the window_size
that computes a band."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from seqpar.algorithms.kernels.binding import padded_backward
from seqpar.algorithms.kernels.capability import flash_attn
from seqpar.algorithms.kernels.tensors import one_width_backward, one_width_forward


def flash_window(sq: int, sk: int, band: tuple[int, int]) -> tuple[int, int]:
    """flash-attn's window_size for a band (it aligns the window bottom-right)."""
    left, right = sk - sq - band[0], band[1] - 1 - (sk - sq)
    if left < 0 or right < 0:
        raise ValueError(f"flash backend: band {band} of a {sq}x{sk} block has no window_size")
    return left, right


Side = tuple[int | None, int]  # (the one value a window side must take, or None; its least value)


def window_sides(sq: int, sk: int, band: tuple[int, int]) -> tuple[Side, Side]:
    """Every flash-attn window_size (left, right) that computes band (a, b) of an sq x sk block
    exactly, side by side. Flash shows row i the keys [i + sk - sq - left, i + sk - sq + right]
    (-1: unbounded) within [0, sk). A side the band cuts for some row takes `flash_window`'s value:
    (value, value). A side it never cuts may take any value from a least one on, or -1: (None,
    least): left when sq - 1 + a <= 0 (least sk - 1), right when b >= sk (least sq - 1). A full
    block is band (1 - sq, sk), a square causal one (1 - sq, 1)."""
    left, right = sk - sq - band[0], band[1] - 1 - (sk - sq)
    left_side = (None, sk - 1) if sq - 1 + band[0] <= 0 else (left, left)
    right_side = (None, sq - 1) if band[1] >= sk else (right, right)
    if min(left_side[1], right_side[1]) < 0:
        raise ValueError(f"flash backend: band {band} of a {sq}x{sk} block has no window_size")
    return left_side, right_side


@one_width_forward
def flash_forward(q, k, v, causal, scale, window=(-1, -1)):
    _check_square(q, k, causal)
    # flash_attn_func pads the head dim to a multiple of 8 itself and, with return_attn_probs,
    # returns (out, softmax_lse (B, H, Sq) float32, S_dmask) in 2.5 .. 2.8
    out, lse, _ = flash_attn().flash_attn_func(q, k, v, softmax_scale=scale, causal=causal,
                                                window_size=window, return_attn_probs=True)
    return out, lse.float()


def _check_square(q, k, causal):
    """flash-attn aligns a causal mask bottom-right when Sq != Sk; 'causal' here is top-left
    (query i sees keys j <= i). They agree on square blocks, the only causal blocks layouts plan."""
    if causal and q.shape[1] != k.shape[1]:
        raise ValueError(f"flash backend: a causal block must be square, got Sq={q.shape[1]} "
                         f"Sk={k.shape[1]}")


@one_width_backward
def flash_backward(dout, q, k, v, out, lse, causal, scale, window=(-1, -1)):
    """flash-attn's `_flash_attn_backward`, called as flash_attn_func's backward calls it: q, k,
    v, out (and dout) with the head dim padded to a multiple of 8, dq, dk, dv allocated padded and
    sliced back."""
    _check_square(q, k, causal)
    return padded_backward(flash_attn()._flash_attn_backward, "_flash_attn_backward", dout, q, k,
                            v, out, lse, causal, scale, window, {})


@dataclass(frozen=True)
class Varlen:
    """Sequence boundaries of one flash-attn varlen call: cumulative query and key lengths [0, ...,
    T] (int32, on the inputs' device, built once per plan: no host-to-device copy per call) and the
    longest query and key sequence (host ints: flash-attn sizes its grid by them)."""

    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int


@one_width_forward
def flash_varlen_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqs: Varlen,
                         causal: bool, window: tuple[int, int], scale: float
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (Tq, H, D), lse (H, Tq) float32) of packed sequences (no FLOPs booked: see module doc).
    flash_attn_varlen_func pads the head dim itself and, with return_attn_probs, returns (out,
    softmax_lse, S_dmask) in 2.6 .. 2.8."""
    out, lse, _ = flash_attn().flash_attn_varlen_func(
        q, k, v, seqs.cu_q, seqs.cu_k, seqs.max_q, seqs.max_k, softmax_scale=scale, causal=causal,
        window_size=window, return_attn_probs=True)
    return out, lse.float()


@one_width_backward
def flash_varlen_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          out: torch.Tensor, lse: torch.Tensor, seqs: Varlen, causal: bool,
                          window: tuple[int, int], scale: float
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of packed sequences given the final out and lse (H, Tq): flash-attn's
    `_flash_attn_varlen_backward` bound by name (a custom op's schema in >= 2.7), head dim padded."""
    extra = {"cu_seqlens_q": seqs.cu_q, "cu_seqlens_k": seqs.cu_k, "max_seqlen_q": seqs.max_q,
             "max_seqlen_k": seqs.max_k}
    return padded_backward(flash_attn()._flash_attn_varlen_backward,
                            "_flash_attn_varlen_backward", dout, q, k, v, out, lse, causal, scale,
                            window, extra)
