"""Local attention that also returns the log-sum-exp, and its backward.

`attend(q, k, v, mask) -> (out, lse)` with q (B, Sq, H, D), k and v (B, Sk, Hkv, D) ("bshd"),
out (B, Sq, H, D) and lse (B, H, Sq). GQA (Hkv < H) is handled here, inside the kernel: query head h
reads key/value head h // (H / Hkv). K and V are never expanded before communication.

Masks: 'full'; 'causal' (top-left aligned: query i sees keys j <= i); 'shifted' (query i sees keys
j < i, the stripe layout's block above the diagonal). A query that sees no key gets lse = -inf and
out = 0. lse is float64 for float64 inputs and float32 otherwise.

Backends: 'flash' (flash-attn on CUDA), 'torch' (aten kernels: the CPU flash kernel, or the
memory-efficient kernel on CUDA), 'math' (explicit float32/float64 reference). 'auto' picks flash on
CUDA when flash-attn is installed, else torch.
"""

from __future__ import annotations

import inspect
import math
from functools import lru_cache

import torch

from seqpar.algorithms import ledger
from seqpar.errors import require

MASKS = ("full", "causal", "shifted")
BACKENDS = ("auto", "flash", "torch", "math")


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulator and lse dtype for inputs of `dtype`."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def attention_flops(batch: int, sq: int, sk: int, heads: int, head_dim: int, mask: str) -> float:
    """Forward FLOPs of one attention block: 4*B*Sq*Sk*H*D, halved for a causal or shifted block
    (the papers' convention; backward is 2.5x forward)."""
    full = 4.0 * batch * sq * sk * heads * head_dim
    return full if mask == "full" else full / 2


@lru_cache(maxsize=1)
def _flash_attn():
    try:
        import flash_attn.flash_attn_interface as fa  # type: ignore[import-not-found]
    except ImportError:
        return None
    return fa


def resolve_backend(backend: str, device: torch.device, dtype: torch.dtype = torch.float32) -> str:
    """The backend that will run: 'auto' takes flash-attn for fp16/bf16 on CUDA when installed,
    torch's kernels where they support the dtype, and the math kernel for float64 on CUDA."""
    require(backend in BACKENDS, "backend", backend, f"must be one of {', '.join(BACKENDS)}")
    half = dtype in (torch.float16, torch.bfloat16)
    if backend == "auto":
        if device.type == "cuda":
            if half and _flash_attn() is not None:
                return "flash"
            return "math" if dtype == torch.float64 else "torch"
        return "torch"
    if backend == "flash":
        require(device.type == "cuda" and _flash_attn() is not None and half, "backend", backend,
                "needs a CUDA device, fp16/bf16 inputs and the flash-attn package "
                "(pip install seqpar[gpu])")
    if backend == "torch" and device.type == "cuda":
        require(dtype != torch.float64, "backend", backend,
                "torch's CUDA attention kernels do not take float64; use 'math' or 'auto'")
    return backend


def _record(q: torch.Tensor, k: torch.Tensor, mask: str, factor: float) -> None:
    b, sq, h, d = q.shape
    ledger.add_flops(factor * attention_flops(b, sq, k.shape[1], h, d, mask))


# ---------------------------------------------------------------------------------------- forward
def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: str = "full", *,
    backend: str = "auto", scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of q over (k, v) under `mask`; returns (out, lse)."""
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    backend = resolve_backend(backend, q.device, q.dtype)
    _record(q, k, mask, 1.0)
    return _forward(q, k, v, mask, backend, scale)


def _forward(q, k, v, mask, backend, scale):
    if mask == "shifted":
        return _shifted_forward(q, k, v, backend, scale)
    causal = mask == "causal"
    if backend == "math":
        return _math_forward(q, k, v, causal, scale)
    if backend == "flash":
        return _flash_forward(q, k, v, causal, scale)
    return _torch_forward(q, k, v, causal, scale)


def _shifted_forward(q, k, v, backend, scale):
    """Query i sees keys j < i: query rows 1.. against keys ..-1 under a causal mask."""
    b, s, h, d = q.shape
    out = torch.zeros_like(q)
    lse = torch.full((b, h, s), float("-inf"), dtype=acc_dtype(q.dtype), device=q.device)
    if s > 1:
        o, lse_rest = _forward(q[:, 1:], k[:, : s - 1], v[:, : s - 1], "causal", backend, scale)
        out[:, 1:] = o
        lse[:, :, 1:] = lse_rest.to(lse.dtype)
    return out, lse


def _expand_kv(t: torch.Tensor, heads: int) -> torch.Tensor:
    group = heads // t.shape[2]
    return t if group == 1 else t.repeat_interleave(group, dim=2)


def _reduce_kv(grad: torch.Tensor, kv_heads: int) -> torch.Tensor:
    b, s, h, d = grad.shape
    return grad if h == kv_heads else grad.view(b, s, kv_heads, h // kv_heads, d).sum(3)


def _math_scores(q, k, causal, scale, shift=0):
    work = acc_dtype(q.dtype)
    kx = _expand_kv(k, q.shape[2]).to(work)
    scores = torch.einsum("bqhd,bkhd->bhqk", q.to(work), kx) * scale
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        keep = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(shift)
        scores = scores.masked_fill(~keep, float("-inf"))
    return scores


def _safe(lse: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)


def _math_forward(q, k, v, causal, scale):
    scores = _math_scores(q, k, causal, scale)
    lse = torch.logsumexp(scores, dim=-1)
    p = torch.exp(scores - _safe(lse).unsqueeze(-1))
    out = torch.einsum("bhqk,bkhd->bqhd", p, _expand_kv(v, q.shape[2]).to(p.dtype))
    return out.to(q.dtype), lse


def _torch_forward(q, k, v, causal, scale):
    h = q.shape[2]
    qt, kt, vt = (t.transpose(1, 2) for t in (q, _expand_kv(k, h), _expand_kv(v, h)))
    if q.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            qt, kt, vt, 0.0, causal, scale=scale)
    else:
        out, lse, _, _ = torch.ops.aten._scaled_dot_product_efficient_attention(
            qt, kt, vt, None, True, 0.0, causal, scale=scale)
        lse = lse[..., : q.shape[1]]
    return out.transpose(1, 2), lse.to(acc_dtype(q.dtype))


def _flash_forward(q, k, v, causal, scale):
    fa = _flash_attn()
    out, lse, _ = fa.flash_attn_func(q, k, v, softmax_scale=scale, causal=causal,
                                     return_attn_probs=True)
    return out, lse.float()


# --------------------------------------------------------------------------------------- backward
def attend_backward(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    out: torch.Tensor, lse: torch.Tensor, mask: str = "full", *,
    backend: str = "auto", scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dq, dk, dv) of one block, given the final (out, lse) of the full attention.

    With the global out and lse, a block's probabilities are the globally normalised ones, so the
    gradients of all blocks simply add up (the ring-attention backward identity).
    """
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    backend = resolve_backend(backend, q.device, q.dtype)
    _record(q, k, mask, 2.5)
    return _backward(dout, q, k, v, out, lse, mask, backend, scale)


def _backward(dout, q, k, v, out, lse, mask, backend, scale):
    if mask == "shifted":
        return _shifted_backward(dout, q, k, v, out, lse, backend, scale)
    causal = mask == "causal"
    if backend == "math":
        return _math_backward(dout, q, k, v, out, lse, causal, scale)
    if backend == "flash":
        return _flash_backward(dout, q, k, v, out, lse, causal, scale)
    return _torch_backward(dout, q, k, v, out, lse, causal, scale)


def _shifted_backward(dout, q, k, v, out, lse, backend, scale):
    s = q.shape[1]
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    if s > 1:
        g = _backward(dout[:, 1:], q[:, 1:], k[:, : s - 1], v[:, : s - 1], out[:, 1:],
                      lse[:, :, 1:], "causal", backend, scale)
        dq[:, 1:], dk[:, : s - 1], dv[:, : s - 1] = g
    return dq, dk, dv


def _math_backward(dout, q, k, v, out, lse, causal, scale):
    h, hkv = q.shape[2], k.shape[2]
    scores = _math_scores(q, k, causal, scale)
    p = torch.exp(scores - _safe(lse.to(scores.dtype)).unsqueeze(-1))
    work = p.dtype
    do, vx = dout.to(work), _expand_kv(v, h).to(work)
    dp = torch.einsum("bqhd,bkhd->bhqk", do, vx)
    delta = (do * out.to(work)).sum(-1).transpose(1, 2).unsqueeze(-1)  # rowsum(dO * O)
    ds = p * (dp - delta) * scale
    dq = torch.einsum("bhqk,bkhd->bqhd", ds, _expand_kv(k, h).to(work))
    dk = torch.einsum("bhqk,bqhd->bkhd", ds, q.to(work))
    dv = torch.einsum("bhqk,bqhd->bkhd", p, do)
    return dq.to(q.dtype), _reduce_kv(dk, hkv).to(k.dtype), _reduce_kv(dv, hkv).to(v.dtype)


def _torch_backward(dout, q, k, v, out, lse, causal, scale):
    h, hkv = q.shape[2], k.shape[2]
    qt, kt, vt = (t.transpose(1, 2) for t in (q, _expand_kv(k, h), _expand_kv(v, h)))
    dot, ot = dout.transpose(1, 2), out.transpose(1, 2)
    if q.device.type == "cpu":
        lse_k = lse.to(torch.float64 if q.dtype == torch.float64 else torch.float32).contiguous()
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dot, qt, kt, vt, ot, lse_k, 0.0, causal, scale=scale)
    else:
        dq, dk, dv, _ = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
            dot, qt, kt, vt, None, ot, lse.float().contiguous(), torch.tensor(0), torch.tensor(0),
            0.0, [True, True, True, False], causal, scale=scale)
    dq, dk, dv = (t.transpose(1, 2) for t in (dq, dk, dv))
    return dq, _reduce_kv(dk, hkv), _reduce_kv(dv, hkv)


def _flash_backward(dout, q, k, v, out, lse, causal, scale):
    fa = _flash_attn()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    wanted = {
        "dout": dout, "q": q, "k": k, "v": v, "out": out, "softmax_lse": lse.float().contiguous(),
        "dq": dq, "dk": dk, "dv": dv, "dropout_p": 0.0, "softmax_scale": scale, "causal": causal,
        "window_size": (-1, -1), "window_size_left": -1, "window_size_right": -1, "softcap": 0.0,
        "alibi_slopes": None, "deterministic": False, "rng_state": None,
    }
    params = inspect.signature(fa._flash_attn_backward).parameters
    fa._flash_attn_backward(**{name: wanted[name] for name in params if name in wanted})
    return dq, dk, dv
