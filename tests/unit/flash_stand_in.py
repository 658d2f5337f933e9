"""A stand-in for flash-attn 2.8's `flash_attn.flash_attn_interface`, for tests without a GPU.

It carries the four entry points seqpar calls, with flash-attn 2.8's signatures: `flash_attn_func`
and `flash_attn_varlen_func` (Python wrappers that pad the head dim to a multiple of 8 and call a
forward op), `_flash_attn_backward` and `_flash_attn_varlen_backward` (`torch.library.custom_op`s
with 2.8's exact parameters, so `inspect.signature` sees only `(*args, **kwargs)`). Every op first
checks its arguments as flash-attn's C++ does (csrc/flash_attn/flash_api.cpp: mha_fwd, mha_bwd,
mha_varlen_fwd, mha_varlen_bwd), plus what the kernels silently assume (cu_seqlens from 0 to the
packed length, max_seqlen at least every length, the lse laid out as they read it); then it computes
the real result in float32 with flash-attn's masks: causal and window_size per sequence, aligned
bottom-right; a row that sees no key gets out = 0 and lse = +inf, as flash-attn writes it. The fake
(meta) implementations let the same calls run on fake CUDA tensors.

`install(monkeypatch, version)` makes it importable as `flash_attn` (with that `__version__`);
`CALLS` records (entry point, arguments) of every call.
"""

from __future__ import annotations

import sys
import types
from typing import Optional

import torch

CALLS: list[tuple[str, dict]] = []

# flash-attn 2.8's parameters, in order (flash_attn/flash_attn_interface.py)
BACKWARD_2_8 = (
    "dout", "q", "k", "v", "out", "softmax_lse", "dq", "dk", "dv", "dropout_p", "softmax_scale",
    "causal", "window_size_left", "window_size_right", "softcap", "alibi_slopes", "deterministic",
    "rng_state",
)
VARLEN_BACKWARD_2_8 = (
    "dout", "q", "k", "v", "out", "softmax_lse", "dq", "dk", "dv", "cu_seqlens_q", "cu_seqlens_k",
    "max_seqlen_q", "max_seqlen_k", "dropout_p", "softmax_scale", "causal", "window_size_left",
    "window_size_right", "softcap", "alibi_slopes", "deterministic", "rng_state",
)


# ------------------------------------------------------------------------------ argument checks
def _check_inputs(q, k, v, dims):
    """mha_*: dtypes, contiguous last dim, head counts, head dim (the Python wrapper pads it)."""
    assert q.dim() == k.dim() == v.dim() == dims, f"expected {dims}-d q, k, v"
    assert q.dtype in (torch.float16, torch.bfloat16), "FlashAttention only support fp16 and bf16"
    assert k.dtype == q.dtype and v.dtype == q.dtype, "query and key/value must have the same dtype"
    for t in (q, k, v):
        assert t.stride(-1) == 1, "Input tensor must have contiguous last dimension"
        assert t.device == q.device
    d = q.shape[-1]
    assert d % 8 == 0, f"head_size should be a multiple of 8, got {d}"
    assert d <= 256, "FlashAttention only supports head dimension at most 256"
    assert q.shape[-2] % k.shape[-2] == 0, "Number of heads in key/value must divide query heads"
    assert k.shape == v.shape and k.shape[-1] == d


def _check_cu(cu, total, max_seqlen, name, device):
    """mha_varlen_*: int32, contiguous, on the device, (batch + 1,); and what the kernel assumes."""
    assert isinstance(cu, torch.Tensor) and cu.dtype == torch.int32, f"{name} must have dtype int32"
    assert cu.is_contiguous() and cu.dim() == 1, f"{name} must be contiguous and 1-d"
    assert cu.device == device, f"{name} must be on the inputs' device"
    assert isinstance(max_seqlen, int), f"max_seqlen for {name} must be an int"
    if cu.device.type == "meta" or _is_fake(cu):
        return
    lengths = cu[1:] - cu[:-1]
    assert int(cu[0]) == 0 and int(cu[-1]) == total, f"{name} must run from 0 to {total}"
    assert bool((lengths >= 0).all()), f"{name} must not decrease"
    assert int(lengths.max()) <= max_seqlen, f"a sequence is longer than max_seqlen ({name})"


def _is_fake(t):
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


def _check_backward(dout, q, k, v, out, lse, grads, lse_shape):
    """mha_bwd / mha_varlen_bwd: the saved tensors, the lse layout, the gradient buffers."""
    assert q.dtype == out.dtype == dout.dtype, "query, out and dout must have the same dtype"
    for t in (out, dout, *grads):
        assert t.stride(-1) == 1, "tensors must have contiguous last dimension"
    hs = q.shape[-1]
    assert hs == -(-dout.shape[-1] // 8) * 8, "head_size must be head_size_og rounded to 8"
    assert out.shape == q.shape and dout.shape[:-1] == q.shape[:-1]
    assert tuple(lse.shape) == lse_shape, f"softmax_lse must be {lse_shape}, got {tuple(lse.shape)}"
    assert lse.dtype == torch.float32 and lse.is_contiguous(), "softmax_lse: float32, contiguous"
    dq, dk, dv = grads
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    assert dq.dtype == dk.dtype == dv.dtype == q.dtype, "dq, dk, dv must have the dtype of q"


# ------------------------------------------------------------------------------------- the math
def _keep(sq, sk, causal, left, right, max_k, device):
    """flash-attn's mask of one sequence: query i sees key j in [i + sk - sq - left, i + sk - sq
    + right] (a negative side unbounded), causal meaning right = 0."""
    if causal:
        right = 0
    left = -1 if left >= max_k else left
    right = -1 if right >= max_k else right
    d = (torch.arange(sk, device=device).unsqueeze(0)
         - torch.arange(sq, device=device).unsqueeze(1) - (sk - sq))
    keep = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if left >= 0:
        keep &= d >= -left
    if right >= 0:
        keep &= d <= right
    return keep


def _probs(q, k, scale, keep):
    """(p, lse) of one sequence: q (sq, H, D), k (sk, Hkv, D); p (H, sq, sk) float32."""
    g = q.shape[1] // k.shape[1]
    s = torch.einsum("qhd,khd->hqk", q.float(), k.float().repeat_interleave(g, 1)) * scale
    s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, -1)
    empty = torch.isneginf(lse)
    p = torch.exp(s - torch.where(empty, torch.zeros_like(lse), lse).unsqueeze(-1))
    return p, torch.where(empty, torch.full_like(lse, float("inf")), lse)


def _seq_forward(q, k, v, scale, keep):
    p, lse = _probs(q, k, scale, keep)
    g = q.shape[1] // k.shape[1]
    out = torch.einsum("hqk,khd->qhd", p, v.float().repeat_interleave(g, 1))
    return out, lse


def _seq_backward(dout, q, k, v, out, lse, scale, keep):
    g = q.shape[1] // k.shape[1]
    s_lse = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    s = torch.einsum("qhd,khd->hqk", q.float(), k.float().repeat_interleave(g, 1)) * scale
    p = torch.exp(s.masked_fill(~keep, float("-inf")) - s_lse.unsqueeze(-1))
    do = torch.nn.functional.pad(dout.float(), (0, q.shape[-1] - dout.shape[-1]))
    dp = torch.einsum("qhd,khd->hqk", do, v.float().repeat_interleave(g, 1))
    delta = (do * out.float()).sum(-1).t().unsqueeze(-1)
    ds = p * (dp - delta) * scale
    dq = torch.einsum("hqk,khd->qhd", ds, k.float().repeat_interleave(g, 1))
    dk = torch.einsum("hqk,qhd->khd", ds, q.float())
    dv = torch.einsum("hqk,qhd->khd", p, do)
    sk, hkv, d = k.shape
    return dq, dk.view(sk, hkv, g, d).sum(2), dv.view(sk, hkv, g, d).sum(2)


def _bounds(cu):
    c = cu.tolist()
    return list(zip(c, c[1:], strict=False))


# ------------------------------------------------------------------------------ dense entry points
@torch.library.custom_op("seqpar_test_standin::_flash_attn_forward", mutates_args=())
def _flash_attn_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float, softmax_scale: float,
    causal: bool, window_size_left: int, window_size_right: int, softcap: float,
    alibi_slopes: Optional[torch.Tensor], return_softmax: bool,  # noqa: UP045 (custom_op schema)
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    _check_inputs(q, k, v, 4)
    b, sq, h, _ = q.shape
    keep = _keep(sq, k.shape[1], causal, window_size_left, window_size_right, k.shape[1], q.device)
    outs, lses = zip(*(_seq_forward(q[i], k[i], v[i], softmax_scale, keep) for i in range(b)),
                     strict=True)
    return (torch.stack(outs).to(q.dtype), torch.stack(lses), q.new_empty(0),
            torch.zeros(2, dtype=torch.int64))


@_flash_attn_forward.register_fake
def _(q, k, v, dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap,
      alibi_slopes, return_softmax):
    _check_inputs(q, k, v, 4)
    b, sq, h, _ = q.shape
    return (torch.empty_like(q), q.new_empty((b, h, sq), dtype=torch.float32), q.new_empty(0),
            q.new_empty(2, dtype=torch.int64))


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash-attn 2.8's flash_attn_func (forward only): pad the head dim, run, slice; (out,
    softmax_lse (B, H, Sq), S_dmask) with return_attn_probs."""
    CALLS.append(("flash_attn_func", dict(q=q, k=k, causal=causal, window_size=window_size)))
    d = q.shape[-1]
    softmax_scale = d ** -0.5 if softmax_scale is None else softmax_scale
    q, k, v = (torch.nn.functional.pad(t, (0, -d % 8)) for t in (q, k, v))
    out, lse, s_dmask, _ = _flash_attn_forward(
        q, k, v, dropout_p, softmax_scale, causal=causal, window_size_left=window_size[0],
        window_size_right=window_size[1], softcap=softcap, alibi_slopes=alibi_slopes,
        return_softmax=return_attn_probs and dropout_p > 0)
    out = out.narrow(-1, 0, d)
    return (out, lse, s_dmask) if return_attn_probs else out


@torch.library.custom_op("seqpar_test_standin::_flash_attn_backward",
                         mutates_args=("dq", "dk", "dv"))
def _flash_attn_backward(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    softmax_lse: torch.Tensor,
    dq: Optional[torch.Tensor], dk: Optional[torch.Tensor], dv: Optional[torch.Tensor],  # noqa: UP045
    dropout_p: float, softmax_scale: float, causal: bool,
    window_size_left: int, window_size_right: int, softcap: float,
    alibi_slopes: Optional[torch.Tensor], deterministic: bool,  # noqa: UP045
    rng_state: Optional[torch.Tensor] = None,  # noqa: UP045
) -> torch.Tensor:
    CALLS.append(("_flash_attn_backward", dict(locals())))
    _check_inputs(q, k, v, 4)
    b, sq, h, _ = q.shape
    _check_backward(dout, q, k, v, out, softmax_lse, (dq, dk, dv), (b, h, sq))
    keep = _keep(sq, k.shape[1], causal, window_size_left, window_size_right, k.shape[1], q.device)
    for i in range(b):
        gq, gk, gv = _seq_backward(dout[i], q[i], k[i], v[i], out[i], softmax_lse[i],
                                   softmax_scale, keep)
        dq[i].copy_(gq)
        dk[i].copy_(gk)
        dv[i].copy_(gv)
    return torch.empty(b, h, -(-sq // 128) * 128)


@_flash_attn_backward.register_fake
def _(dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p, softmax_scale, causal,
      window_size_left, window_size_right, softcap, alibi_slopes, deterministic, rng_state=None):
    CALLS.append(("_flash_attn_backward", dict(locals())))
    _check_inputs(q, k, v, 4)
    b, sq, h, _ = q.shape
    _check_backward(dout, q, k, v, out, softmax_lse, (dq, dk, dv), (b, h, sq))
    return q.new_empty((b, h, -(-sq // 128) * 128), dtype=torch.float32)


# ----------------------------------------------------------------------------- varlen entry points
@torch.library.custom_op("seqpar_test_standin::_flash_attn_varlen_forward", mutates_args=())
def _flash_attn_varlen_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, dropout_p: float,
    softmax_scale: float, causal: bool, window_size_left: int = -1, window_size_right: int = -1,
    softcap: float = 0.0, alibi_slopes: Optional[torch.Tensor] = None,  # noqa: UP045
    return_softmax: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    _check_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    out = torch.zeros(q.shape, dtype=torch.float32)
    lse = torch.empty(q.shape[1], q.shape[0])  # (H, total_q): flash-attn >= 2.6
    for (a, b), (c, d) in zip(_bounds(cu_seqlens_q), _bounds(cu_seqlens_k), strict=True):
        keep = _keep(b - a, d - c, causal, window_size_left, window_size_right, max_seqlen_k,
                     q.device)
        out[a:b], lse[:, a:b] = _seq_forward(q[a:b], k[c:d], v[c:d], softmax_scale, keep)
    return out.to(q.dtype), lse, q.new_empty(0), torch.zeros(2, dtype=torch.int64)


@_flash_attn_varlen_forward.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
      causal, window_size_left=-1, window_size_right=-1, softcap=0.0, alibi_slopes=None,
      return_softmax=False):
    _check_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    return (torch.empty_like(q), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32),
            q.new_empty(0), q.new_empty(2, dtype=torch.int64))


def _check_varlen_forward(q, k, v, cu_q, cu_k, max_q, max_k):
    _check_inputs(q, k, v, 3)
    assert cu_q.numel() - 1 > 0, "batch size must be positive"
    assert cu_k.numel() == cu_q.numel(), "cu_seqlens_k must be (batch_size + 1,)"
    _check_cu(cu_q, q.shape[0], max_q, "cu_seqlens_q", q.device)
    _check_cu(cu_k, k.shape[0], max_k, "cu_seqlens_k", q.device)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, block_table=None):
    """flash-attn 2.8's flash_attn_varlen_func (forward only): pad the head dim, run, slice; (out
    (Tq, H, D), softmax_lse (H, Tq), S_dmask) with return_attn_probs."""
    CALLS.append(("flash_attn_varlen_func", dict(
        q=q, k=k, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k, causal=causal, window_size=window_size)))
    d = q.shape[-1]
    softmax_scale = d ** -0.5 if softmax_scale is None else softmax_scale
    q, k, v = (torch.nn.functional.pad(t, (0, -d % 8)) for t in (q, k, v))
    out, lse, s_dmask, _ = _flash_attn_varlen_forward(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
        causal=causal, window_size_left=window_size[0], window_size_right=window_size[1],
        softcap=softcap, alibi_slopes=alibi_slopes,
        return_softmax=return_attn_probs and dropout_p > 0)
    out = out.narrow(-1, 0, d)
    return (out, lse, s_dmask) if return_attn_probs else out


@torch.library.custom_op("seqpar_test_standin::_flash_attn_varlen_backward",
                         mutates_args=("dq", "dk", "dv"))
def _flash_attn_varlen_backward(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    softmax_lse: torch.Tensor,
    dq: Optional[torch.Tensor], dk: Optional[torch.Tensor], dv: Optional[torch.Tensor],  # noqa: UP045
    cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int,
    dropout_p: float, softmax_scale: float, causal: bool,
    window_size_left: int, window_size_right: int, softcap: float,
    alibi_slopes: Optional[torch.Tensor], deterministic: bool,  # noqa: UP045
    rng_state: Optional[torch.Tensor] = None,  # noqa: UP045
) -> torch.Tensor:
    CALLS.append(("_flash_attn_varlen_backward", dict(locals())))
    _check_varlen_backward(dout, q, k, v, out, softmax_lse, (dq, dk, dv), cu_seqlens_q,
                           cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    for (a, b), (c, d) in zip(_bounds(cu_seqlens_q), _bounds(cu_seqlens_k), strict=True):
        keep = _keep(b - a, d - c, causal, window_size_left, window_size_right, max_seqlen_k,
                     q.device)
        gq, gk, gv = _seq_backward(dout[a:b], q[a:b], k[c:d], v[c:d], out[a:b],
                                   softmax_lse[:, a:b], softmax_scale, keep)
        dq[a:b].copy_(gq)
        dk[c:d].copy_(gk)
        dv[c:d].copy_(gv)
    return torch.empty(q.shape[1], q.shape[0] + 128 * (cu_seqlens_q.numel() - 1))


@_flash_attn_varlen_backward.register_fake
def _(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
      max_seqlen_k, dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap,
      alibi_slopes, deterministic, rng_state=None):
    CALLS.append(("_flash_attn_varlen_backward", dict(locals())))
    _check_varlen_backward(dout, q, k, v, out, softmax_lse, (dq, dk, dv), cu_seqlens_q,
                           cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    batch = cu_seqlens_q.shape[0] - 1
    return q.new_empty((q.shape[1], q.shape[0] + 128 * batch), dtype=torch.float32)


def _check_varlen_backward(dout, q, k, v, out, lse, grads, cu_q, cu_k, max_q, max_k):
    _check_varlen_forward(q, k, v, cu_q, cu_k, max_q, max_k)
    _check_backward(dout, q, k, v, out, lse, grads, (q.shape[1], q.shape[0]))


# --------------------------------------------------------------------------------------- install
def install(monkeypatch, version: str = "2.8.3") -> list[tuple[str, dict]]:
    """Make the stand-in importable as flash-attn `version`; returns CALLS (cleared)."""
    from seqpar.algorithms import kernels

    iface = types.ModuleType("flash_attn.flash_attn_interface")
    iface.flash_attn_func = flash_attn_func
    iface.flash_attn_varlen_func = flash_attn_varlen_func
    iface._flash_attn_backward = _flash_attn_backward
    iface._flash_attn_varlen_backward = _flash_attn_varlen_backward
    package = types.ModuleType("flash_attn")
    package.__version__ = version
    package.flash_attn_interface = iface
    monkeypatch.setitem(sys.modules, "flash_attn", package)
    monkeypatch.setitem(sys.modules, "flash_attn.flash_attn_interface", iface)
    kernels.flash_attn.cache_clear()
    CALLS.clear()
    return CALLS


def calls(name: str) -> list[dict]:
    """The recorded arguments of every call of one entry point."""
    return [args for entry, args in CALLS if entry == name]


def varlen_backward_arguments() -> dict:
    """A correct `_flash_attn_varlen_backward` call: two sequences (3x5, 2x2), GQA, head dim 16."""
    h, hkv, d = 4, 2, 16
    q, out, dout = (torch.randn(5, h, d, dtype=torch.float16) for _ in range(3))
    k, v = (torch.randn(7, hkv, d, dtype=torch.float16) for _ in range(2))
    return dict(
        dout=dout, q=q, k=k, v=v, out=out, softmax_lse=torch.randn(h, 5),
        dq=torch.empty_like(q), dk=torch.empty_like(k), dv=torch.empty_like(v),
        cu_seqlens_q=torch.tensor([0, 3, 5], dtype=torch.int32),
        cu_seqlens_k=torch.tensor([0, 5, 7], dtype=torch.int32), max_seqlen_q=3, max_seqlen_k=5,
        dropout_p=0.0, softmax_scale=0.25, causal=False, window_size_left=-1,
        window_size_right=-1, softcap=0.0, alibi_slopes=None, deterministic=False)
