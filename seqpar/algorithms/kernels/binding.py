"""flash-attn argument binding: its backward entry points take different parameters across versions
(2.5 .. 2.8, a torch custom op from 2.7); seqpar binds them by name, from the signature or the op's
schema, on inputs with the head dim padded to a multiple of 8."""

from __future__ import annotations

import inspect
from functools import cache

import torch
import torch.nn.functional as F

from seqpar.algorithms.kernels.tensors import contiguous


def padded_backward(fn, name, dout, q, k, v, out, lse, causal, scale, window, extra):
    """Call a flash-attn backward (dense or varlen: `extra` holds the varlen arguments) on inputs
    with the head dim padded to a multiple of 8; dq, dk, dv sliced back to the head dim."""
    d = q.shape[-1]
    dout_p, q_p, k_p, v_p, out_p = (pad_head_dim(t) for t in (dout, q, k, v, out))
    dq, dk, dv = torch.empty_like(q_p), torch.empty_like(k_p), torch.empty_like(v_p)
    known = {
        "dout": dout_p, "q": q_p, "k": k_p, "v": v_p, "out": out_p,
        "softmax_lse": contiguous(lse.float()), "dq": dq, "dk": dk, "dv": dv,
        "dropout_p": 0.0, "softmax_scale": scale, "causal": causal,
        "window_size": window,  # <= 2.6
        "window_size_left": window[0], "window_size_right": window[1],  # >= 2.7
        "softcap": 0.0, "alibi_slopes": None, "deterministic": False, "rng_state": None, **extra,
    }
    names, required = op_parameters(fn)
    unknown = sorted(required - known.keys())
    if unknown:
        raise RuntimeError(f"flash-attn's {name} takes {', '.join(unknown)}, which seqpar does not "
                           f"know: unsupported flash-attn version")
    fn(**{p: known[p] for p in names if p in known})
    return tuple(t.narrow(-1, 0, d) for t in (dq, dk, dv))


def pad_head_dim(t: torch.Tensor) -> torch.Tensor:
    """t with its last dim zero-padded to a multiple of 8 (flash-attn's kernels need it)."""
    pad = -t.shape[-1] % 8
    return F.pad(t, (0, pad)) if pad else t


@cache
def op_parameters(fn) -> tuple[tuple[str, ...], frozenset[str]]:
    """(parameter names in order, those without a default) of a Python function or a
    torch.library op. A custom op (`torch.library.custom_op`, as flash-attn >= 2.7 wraps
    `_flash_attn_backward`) shows `(*args, **kwargs)` to inspect.signature; its schema has the
    real parameters. Cached per function (the backward asks on every call)."""
    op = getattr(fn, "_opoverload", None) or getattr(fn, "default", None)
    schema = getattr(op, "_schema", None)
    if schema is not None:
        return (tuple(a.name for a in schema.arguments),
                frozenset(a.name for a in schema.arguments if not a.has_default_value()))
    params = inspect.signature(fn).parameters.values()
    return (tuple(p.name for p in params),
            frozenset(p.name for p in params if p.default is inspect.Parameter.empty
                      and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)))
