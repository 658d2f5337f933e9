"""Tensor helpers every backend shares: accumulation dtype, softmax scale, row slices, GQA
expansion and reduction, a V head dim of its own on kernels that take one width."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulator and lse dtype for inputs of `dtype`."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def default_scale(scale: float | None, head_dim: int) -> float:
    """The softmax scale: as given, else 1/sqrt(head_dim)."""
    return scale if scale is not None else 1.0 / math.sqrt(head_dim)


# narrow(), pad() and clone() rather than [] indexing, copy_() and contiguous(): the tests run these
# CUDA paths on fake CUDA tensors, which a CPU-only torch cannot index with [], copy_ into or make
# contiguous (each wants a CUDA device guard)
def seq_rows(t: torch.Tensor, start: int, stop: int | None = None) -> torch.Tensor:
    """t[:, start:stop] (sequence rows of a bshd tensor)."""
    stop = t.shape[1] if stop is None else stop
    return t.narrow(1, start, stop - start)


def contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.clone(memory_format=torch.contiguous_format)


def pad_rows(t: torch.Tensor, before: int, after: int) -> torch.Tensor:
    """t (bshd) with zero rows added before and after its sequence rows."""
    return F.pad(t, (0, 0, 0, 0, before, after))


def expand_kv(t: torch.Tensor, heads: int) -> torch.Tensor:
    group = heads // t.shape[2]
    return t if group == 1 else t.repeat_interleave(group, dim=2)


def reduce_kv(grad: torch.Tensor, kv_heads: int) -> torch.Tensor:
    b, s, h, d = grad.shape
    return grad if h == kv_heads else grad.view(b, s, kv_heads, h // kv_heads, d).sum(3)


def finite_lse(lse: torch.Tensor) -> torch.Tensor:
    """lse with -inf (a row that sees no key) as 0, everything else as it is: one operation
    (nan and +inf are kept, so this is exactly where(isneginf(lse), 0, lse))."""
    return lse.nan_to_num(nan=math.nan, posinf=math.inf, neginf=0.0)


def widen(t: torch.Tensor, width: int) -> torch.Tensor:
    """t (..., d) with zeros after its last dim up to `width` (as it is when already that wide)."""
    return t if t.shape[-1] == width else F.pad(t, (0, width - t.shape[-1]))


def one_width_forward(kernel: Callable[..., Any]) -> Callable[..., Any]:
    """A fused kernel's forward (q, k, v, ...) -> (out, lse), which takes one head dim for q, k
    and v, for a V of its own width (MLA: q, k 192, v 128): the narrower side zero-padded to the
    wider (zero columns add nothing to QKᵀ and make zero columns of PV; the caller passes the
    scale, so padding does not change it), out cut back to V's width."""
    @functools.wraps(kernel)
    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: Any, **kwargs: Any):
        dv = v.shape[-1]
        if q.shape[-1] == dv:
            return kernel(q, k, v, *args, **kwargs)
        d = max(q.shape[-1], dv)
        out, lse = kernel(widen(q, d), widen(k, d), widen(v, d), *args, **kwargs)
        return out.narrow(-1, 0, dv), lse
    return run


def one_width_backward(kernel: Callable[..., Any]) -> Callable[..., Any]:
    """`one_width_forward` for a backward (dout, q, k, v, out, ...) -> (dq, dk, dv): dout and out
    padded as V, the gradients cut back to their tensors' widths."""
    @functools.wraps(kernel)
    def run(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            out: torch.Tensor, *args: Any, **kwargs: Any):
        dqk, dv = q.shape[-1], v.shape[-1]
        if dqk == dv:
            return kernel(dout, q, k, v, out, *args, **kwargs)
        d = max(dqk, dv)
        gq, gk, gv = kernel(*(widen(t, d) for t in (dout, q, k, v, out)), *args, **kwargs)
        return gq.narrow(-1, 0, dqk), gk.narrow(-1, 0, dqk), gv.narrow(-1, 0, dv)
    return run
