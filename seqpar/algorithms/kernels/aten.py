"""The torch backend: aten's CPU flash kernel (explicit masks as additive ones), or the memory-efficient
kernel on CUDA."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from seqpar.algorithms.kernels.tensors import (
    acc_dtype,
    expand_kv,
    finite_lse,
    one_width_backward,
    one_width_forward,
    reduce_kv,
)


def _additive(keep: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A boolean mask as the additive mask (0 / -inf, the query's dtype) the CPU kernel takes."""
    if keep is None:
        return None
    return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill(~keep, float("-inf"))


@one_width_forward
def aten_forward(q, k, v, causal, scale, keep=None):
    h = q.shape[2]
    qt, kt, vt = (t.transpose(1, 2) for t in (q, expand_kv(k, h), expand_kv(v, h)))
    if q.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            qt, kt, vt, 0.0, causal, attn_mask=_additive(keep, q.dtype), scale=scale)
        if keep is not None:  # the kernel gives a row that sees no key lse 0; it is -inf
            lse = lse.masked_fill(~keep.any(-1), float("-inf"))
    else:
        out, lse, _, _ = torch.ops.aten._scaled_dot_product_efficient_attention(
            qt, kt, vt, None, True, 0.0, causal, scale=scale)
        lse = lse.narrow(-1, 0, q.shape[1])  # the kernel pads it to a multiple of 32
    return out.transpose(1, 2), lse.to(acc_dtype(q.dtype))


@one_width_backward
def aten_backward(dout, q, k, v, out, lse, causal, scale, keep=None):
    h, hkv = q.shape[2], k.shape[2]
    qt, kt, vt = (t.transpose(1, 2) for t in (q, expand_kv(k, h), expand_kv(v, h)))
    dot, ot = dout.transpose(1, 2), out.transpose(1, 2)
    if q.device.type == "cpu":
        lse_k = finite_lse(lse).to(torch.float64 if q.dtype == torch.float64 else torch.float32)
        lse_k = lse_k.contiguous()
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dot, qt, kt, vt, ot, lse_k, 0.0, causal, attn_mask=_additive(keep, q.dtype),
            scale=scale)
    else:
        dq, dk, dv, _ = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
            dot, qt, kt, vt, None, ot, efficient_lse(lse), torch.tensor(0), torch.tensor(0),
            0.0, [True, True, True, False], causal, scale=scale)
    dq, dk, dv = (t.transpose(1, 2) for t in (dq, dk, dv))
    return dq, reduce_kv(dk, hkv), reduce_kv(dv, hkv)


def efficient_lse(lse: torch.Tensor) -> torch.Tensor:
    """lse (B, H, Sq) laid out as the memory-efficient forward returns it, the layout its backward
    takes: float32 (B, H, ceil(Sq / 32) * 32) on CUDA (the kernel requires its head and batch
    strides to be multiples of 8: an lse of stride Sq fails for most Sq), (B, H, Sq) on ROCm."""
    sq = lse.shape[-1]
    width = sq if torch.version.hip else -(-sq // 32) * 32
    return F.pad(lse.float(), (0, width - sq))
