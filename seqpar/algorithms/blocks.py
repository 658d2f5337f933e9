"""Blockwise attention: run a (query block, key block) pair as the kernel calls `layouts` plans.

Forward merges each call into (out, lse) accumulators with the online softmax; backward adds each
call's gradients into dq, dk, dv accumulators. Every ring-like algorithm is a loop over these two.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from seqpar.algorithms import kernels
from seqpar.algorithms.layouts import Task
from seqpar.algorithms.softmax_merge import empty_partial, merge_into


def new_partial(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) accumulators for queries q that have seen no key."""
    work = kernels.acc_dtype(q.dtype)
    return empty_partial(q, work, work)


def zeros_acc(t: torch.Tensor) -> torch.Tensor:
    """A gradient accumulator shaped like t, in the accumulation dtype."""
    return torch.zeros(t.shape, dtype=kernels.acc_dtype(t.dtype), device=t.device)


def forward_tasks(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tasks: Sequence[Task],
    acc_out: torch.Tensor, acc_lse: torch.Tensor, backend: str, scale: float | None,
) -> None:
    """Merge attention of q over (k, v), as planned by `tasks`, into the accumulators."""
    for t in tasks:
        out, lse = kernels.attend(q[:, t.q0:t.q1], k[:, t.k0:t.k1], v[:, t.k0:t.k1], t.mask,
                                  backend=backend, scale=scale, band=t.band)
        merge_into(acc_out[:, t.q0:t.q1], acc_lse[:, :, t.q0:t.q1], out, lse)


def backward_tasks(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    out: torch.Tensor, lse: torch.Tensor, tasks: Sequence[Task],
    dq: torch.Tensor | None, dk: torch.Tensor | None, dv: torch.Tensor | None,
    backend: str, scale: float | None,
) -> None:
    """Add the gradients of the planned kernel calls into dq, dk, dv (any may be None)."""
    for t in tasks:
        gq, gk, gv = kernels.attend_backward(
            dout[:, t.q0:t.q1], q[:, t.q0:t.q1], k[:, t.k0:t.k1], v[:, t.k0:t.k1],
            out[:, t.q0:t.q1], lse[:, :, t.q0:t.q1], t.mask, backend=backend, scale=scale,
            band=t.band)
        if dq is not None:
            dq[:, t.q0:t.q1] += gq
        if dk is not None:
            dk[:, t.k0:t.k1] += gk
        if dv is not None:
            dv[:, t.k0:t.k1] += gv


def pack_kv(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One contiguous buffer (B, s, 2*Hkv, D) so that K and V travel in one message."""
    return torch.cat([k, v], dim=2).contiguous()


def unpack_kv(kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    k, v = kv.chunk(2, dim=2)
    return k, v


def attend_tasks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tasks: Sequence[Task],
                 backend: str, scale: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of q over (k, v) as planned. One call that covers every query row returns the
    kernel's result as it is (no accumulator, no merge); otherwise the calls are merged."""
    if len(tasks) == 1 and tasks[0].q0 == 0 and tasks[0].q1 == q.shape[1]:
        t = tasks[0]
        out, lse = kernels.attend(q, k[:, t.k0:t.k1], v[:, t.k0:t.k1], t.mask, backend=backend,
                                  scale=scale, band=t.band)
        return out, lse.to(kernels.acc_dtype(q.dtype))
    acc_out, acc_lse = new_partial(q)
    forward_tasks(q, k, v, tasks, acc_out, acc_lse, backend, scale)
    return acc_out.to(q.dtype), acc_lse


def grads_tasks(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                out: torch.Tensor, lse: torch.Tensor, tasks: Sequence[Task], backend: str,
                scale: float | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of the planned calls. One call over all of q and k returns the kernel's
    gradients as they are; otherwise they are summed in the accumulation dtype."""
    if len(tasks) == 1 and (tasks[0].q0, tasks[0].q1, tasks[0].k0, tasks[0].k1) == (
            0, q.shape[1], 0, k.shape[1]):
        return kernels.attend_backward(dout, q, k, v, out, lse, tasks[0].mask, backend=backend,
                                       scale=scale, band=tasks[0].band)
    dq, dk, dv = (zeros_acc(t) for t in (q, k, v))
    backward_tasks(dout, q, k, v, out, lse, tasks, dq, dk, dv, backend, scale)
    return dq, dk, dv


def permute(t: torch.Tensor, index: torch.Tensor | None, dim: int = 1) -> torch.Tensor:
    """t reordered along dim by index (None: as it is)."""
    return t if index is None else t.index_select(dim, index)
