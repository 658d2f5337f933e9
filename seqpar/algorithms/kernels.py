"""Local attention that also returns the log-sum-exp, and its backward.

`attend(q, k, v, mask) -> (out, lse)` with q (B, Sq, H, D), k and v (B, Sk, Hkv, D) ("bshd"),
out (B, Sq, H, D) and lse (B, H, Sq). GQA (Hkv < H) is handled here, inside the kernel: query head h
reads key/value head h // (H / Hkv). K and V are never expanded before communication.

Masks: 'full'; 'causal' (top-left aligned: query i sees keys j <= i); 'shifted' (query i sees keys
j < i, the stripe layout's block above the diagonal); 'band' with `band=(a, b)` (query i sees keys j
with a <= j - i < b: a sliding window's block, or a document's lower edge). flash-attn runs a band
through its `window_size` (bottom-right aligned: left = Sk - Sq - a, right = b - 1 - (Sk - Sq)); the
CPU flash kernel through an explicit boolean mask; elsewhere the math kernel with that mask. A band
much narrower than its block runs as row tiles, each against only the keys it sees (`band_tiles`).
A query that sees no key gets lse = -inf and out = 0. lse is float64 for float64 inputs
and float32 otherwise.

Backends: 'flash' (flash-attn 2 on CUDA), 'torch' (aten kernels: the CPU flash kernel, or the
memory-efficient kernel on CUDA), 'math' (explicit float32/float64 reference). 'auto' picks flash on
CUDA where flash-attn 2 runs (installed; fp16/bf16; head dim <= 256; compute capability 8.x or 9.0),
else torch's kernels where they take the dtype, else math.

Packed sequences (`flash_varlen_forward` / `flash_varlen_backward`): flash-attn's varlen entry points
run many (query range, key range) pairs in one call: q (Tq, H, D), k and v (Tk, Hkv, D) concatenated
sequence by sequence, `Varlen` their int32 boundaries on the device and longest lengths; causal and
window_size apply per sequence, aligned bottom-right. The lse is (H, Tq) float32 in and out, the
layout flash-attn >= 2.6 uses (2.5 pads it per sequence: `flash_varlen_supported` says no there).
`blocks` groups a block's tasks into these calls; FLOPs are booked per task (`book_flops`).
"""

from __future__ import annotations

import inspect
import math
import re
import sys
from dataclasses import dataclass
from functools import cache, lru_cache

import torch
import torch.nn.functional as F

from seqpar.algorithms import ledger
from seqpar.errors import require

MASKS = ("full", "causal", "shifted")  # the masks without parameters; plus "band" (band=(a, b))
BACKENDS = ("auto", "flash", "torch", "math")


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulator and lse dtype for inputs of `dtype`."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def default_scale(scale: float | None, head_dim: int) -> float:
    """The softmax scale: as given, else 1/sqrt(head_dim)."""
    return scale if scale is not None else 1.0 / math.sqrt(head_dim)


def attention_flops(batch: int, sq: int, sk: int, heads: int, head_dim: int, mask: str,
                    band: tuple[int, int] | None = None) -> float:
    """Forward FLOPs of one attention block: 4*B*Sq*Sk*H*D, halved for a causal or shifted block
    (the papers' convention; backward is 2.5x forward); a band block counts its visible pairs."""
    if mask == "band":
        return 4.0 * batch * band_pairs(sq, sk, band) * heads * head_dim
    full = 4.0 * batch * sq * sk * heads * head_dim
    return full if mask == "full" else full / 2


def band_pairs(sq: int, sk: int, band: tuple[int, int]) -> int:
    """Visible (i, j) pairs of a band block: 0 <= i < sq, 0 <= j < sk and band[0] <= j - i <
    band[1]. Row i sees clamp(i + b, 0, sk) - clamp(i + a, 0, sk) keys; summed in closed form
    (host integers only: no tensor work per call)."""
    def below(c: int) -> int:  # sum over rows of clamp(i + c, 0, sk): pairs with j - i < c
        return _clamp_sum(c + sq - 1, sk) - _clamp_sum(c - 1, sk)

    return max(0, below(band[1]) - below(band[0]))


def _clamp_sum(x: int, sk: int) -> int:
    """sum of clamp(t, 0, sk) over integers t <= x."""
    if x <= 0:
        return 0
    m = min(x, sk)
    return m * (m + 1) // 2 + (x - m) * sk


def band_keep(sq: int, sk: int, band: tuple[int, int], device) -> torch.Tensor:
    """The band's boolean mask (True: visible), (Sq, Sk)."""
    d = (torch.arange(sk, device=device).unsqueeze(0)
         - torch.arange(sq, device=device).unsqueeze(1))
    return (d >= band[0]) & (d < band[1])


@lru_cache(maxsize=1)
def _flash_attn():
    try:
        import flash_attn.flash_attn_interface as fa  # type: ignore[import-not-found]
    except ImportError:
        return None
    return fa


FLASH_MAX_HEAD_DIM = 256  # flash-attn 2's forward and backward kernels


def _capability(device: torch.device) -> tuple[int, int]:
    """(major, minor) compute capability of a CUDA device (looked up once per device)."""
    return _capability_of(device.index if device.index is not None else torch.cuda.current_device())


@cache
def _capability_of(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def _supports_flash(major: int, minor: int) -> bool:
    """flash-attn 2 runs on sm8x (Ampere, Ada) and sm90 (Hopper) only: mha_fwd/mha_bwd check
    `major == 8 || (major == 9 && minor == 0)`."""
    return major == 8 or (major, minor) == (9, 0)


def flash_unsupported(device: torch.device, dtype: torch.dtype,
                      head_dim: int | None = None) -> str | None:
    """Why flash-attn 2 cannot run q of `dtype` and `head_dim` on `device`, or None if it can."""
    if device.type != "cuda":
        return f"needs a CUDA device, not {device.type}"
    if dtype not in (torch.float16, torch.bfloat16):
        return f"takes float16/bfloat16 inputs, not {str(dtype).removeprefix('torch.')}"
    if head_dim is not None and head_dim > FLASH_MAX_HEAD_DIM:
        return f"takes head_dim <= {FLASH_MAX_HEAD_DIM}, not {head_dim}"
    major, minor = _capability(device)
    if not _supports_flash(major, minor):
        return (f"needs compute capability 8.x or 9.0 (Ampere, Ada, Hopper); {device} is "
                f"sm_{major}{minor}")
    if _flash_attn() is None:
        return "needs the flash-attn package (pip install seqpar[gpu])"
    return None


def resolve_backend(backend: str, device: torch.device, dtype: torch.dtype = torch.float32, *,
                    head_dim: int | None = None) -> str:
    """The backend that will run: 'auto' takes flash-attn where it runs (see flash_unsupported),
    else torch's kernels where they take the dtype (on CUDA: fp32/fp16 anywhere, bf16 on sm80+),
    else the math kernel. An explicit backend the device cannot run is a ConfigError."""
    require(backend in BACKENDS, "backend", backend, f"must be one of {', '.join(BACKENDS)}")
    cuda = device.type == "cuda"
    if backend == "auto":
        if not cuda:
            return "torch"
        if flash_unsupported(device, dtype, head_dim) is None:
            return "flash"
        return "torch" if _torch_cuda_takes(device, dtype) else "math"
    if backend == "flash":
        why = flash_unsupported(device, dtype, head_dim)
        require(why is None, "backend", backend, str(why))
    if backend == "torch" and cuda:
        require(_torch_cuda_takes(device, dtype), "backend", backend,
                f"torch's CUDA attention kernels do not take {str(dtype).removeprefix('torch.')} "
                f"on {device}; use 'math' or 'auto'")
    return backend


def _torch_cuda_takes(device: torch.device, dtype: torch.dtype) -> bool:
    """The memory-efficient kernel has fp32 and fp16 kernels from sm50, bf16 ones from sm80, and
    no float64 ones."""
    if dtype == torch.float64:
        return False
    return dtype != torch.bfloat16 or _capability(device)[0] >= 8


def book_flops(batch: int, sq: int, sk: int, heads: int, head_dim: int, mask: str, factor: float,
               band: tuple[int, int] | None = None) -> None:
    """Book one block's FLOPs (factor 1: forward, 2.5: backward) in the ledger."""
    ledger.add_flops(factor * attention_flops(batch, sq, sk, heads, head_dim, mask, band))


def _record(q: torch.Tensor, k: torch.Tensor, mask: str, factor: float,
            band: tuple[int, int] | None = None) -> None:
    b, sq, h, d = q.shape
    book_flops(b, sq, k.shape[1], h, d, mask, factor, band)


# ---------------------------------------------------------------------------------------- forward
def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: str = "full", *,
    backend: str = "auto", scale: float | None = None, band: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of q over (k, v) under `mask` (band: the offsets of mask 'band'); (out, lse)."""
    scale = default_scale(scale, q.shape[-1])
    backend = resolve_backend(backend, q.device, q.dtype, head_dim=q.shape[-1])
    _record(q, k, mask, 1.0, band)
    if mask == "band":
        return _band_forward(q, k, v, band, backend, scale)
    return _forward(q, k, v, mask, backend, scale)


# Without flash-attn a band runs under an explicit mask, over the whole (Sq, Sk) rectangle. A band
# much narrower than its block therefore runs as row tiles of BAND_TILE rows, each against only the
# keys its rows see (Sq x (BAND_TILE + width) pairs instead of Sq x Sk): a window of N/8 over a
# whole sequence costs about a quarter of the full rectangle, not all of it.
BAND_TILE = 256


def band_tiles(sq: int, sk: int, band: tuple[int, int]
               ) -> list[tuple[int, int, int, int, tuple[int, int]]]:
    """(r0, r1, c0, c1, tile band) for the row tiles [r0, r1) of a band block, each against keys
    [c0, c1) (c1 <= c0: its rows see nothing) and the band relative to the tile. One tile, the block
    as it is, unless tiling computes under three quarters of the rectangle."""
    width = band[1] - band[0]
    if sq <= BAND_TILE or 4 * (BAND_TILE + width) >= 3 * sk:
        return [(0, sq, 0, sk, band)]
    tiles = []
    for r0 in range(0, sq, BAND_TILE):
        r1 = min(r0 + BAND_TILE, sq)
        c0, c1 = max(0, r0 + band[0]), min(sk, r1 - 1 + band[1])
        tiles.append((r0, r1, c0, c1, (band[0] + r0 - c0, band[1] + r0 - c0)))
    return tiles


def _band_forward(q, k, v, band, backend, scale):
    sq, sk = q.shape[1], k.shape[1]
    if backend == "flash":
        return _flash_forward(q, k, v, False, scale, window=_flash_window(sq, sk, band))
    tiles = band_tiles(sq, sk, band)
    if len(tiles) == 1:
        return _band_dense_forward(q, k, v, band, backend, scale)
    outs, lses = [], []
    for r0, r1, c0, c1, tile_band in tiles:
        rows = _rows(q, r0, r1)
        if c1 <= c0:
            outs.append(torch.zeros_like(rows))
            lses.append(torch.full((q.shape[0], q.shape[2], r1 - r0), float("-inf"),
                                   dtype=acc_dtype(q.dtype), device=q.device))
            continue
        o, lse = _band_dense_forward(rows, _rows(k, c0, c1), _rows(v, c0, c1), tile_band,
                                     backend, scale)
        outs.append(o)
        lses.append(lse.to(acc_dtype(q.dtype)))
    return torch.cat(outs, dim=1), torch.cat(lses, dim=2)


def _band_dense_forward(q, k, v, band, backend, scale):
    sq, sk = q.shape[1], k.shape[1]
    keep = band_keep(sq, sk, band, q.device)
    if backend == "torch" and q.device.type == "cpu":
        return _torch_forward(q, k, v, False, scale, keep)
    return _math_forward(q, k, v, False, scale, keep)


def _flash_window(sq: int, sk: int, band: tuple[int, int]) -> tuple[int, int]:
    """flash-attn's window_size for a band (it aligns the window bottom-right)."""
    left, right = sk - sq - band[0], band[1] - 1 - (sk - sq)
    if left < 0 or right < 0:
        raise ValueError(f"flash backend: band {band} of a {sq}x{sk} block has no window_size")
    return left, right


Side = tuple[int | None, int]  # (the one value a window side must take, or None; its least value)


def window_sides(sq: int, sk: int, band: tuple[int, int]) -> tuple[Side, Side]:
    """Every flash-attn window_size (left, right) that computes band (a, b) of an sq x sk block
    exactly, side by side. Flash shows row i the keys [i + sk - sq - left, i + sk - sq + right]
    (-1: unbounded) within [0, sk). A side the band cuts for some row takes `_flash_window`'s value:
    (value, value). A side it never cuts may take any value from a least one on, or -1: (None,
    least): left when sq - 1 + a <= 0 (least sk - 1), right when b >= sk (least sq - 1). A full
    block is band (1 - sq, sk), a square causal one (1 - sq, 1)."""
    left, right = sk - sq - band[0], band[1] - 1 - (sk - sq)
    left_side = (None, sk - 1) if sq - 1 + band[0] <= 0 else (left, left)
    right_side = (None, sq - 1) if band[1] >= sk else (right, right)
    if min(left_side[1], right_side[1]) < 0:
        raise ValueError(f"flash backend: band {band} of a {sq}x{sk} block has no window_size")
    return left_side, right_side


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
    if s == 1:
        lse = torch.full((b, h, s), float("-inf"), dtype=acc_dtype(q.dtype), device=q.device)
        return torch.zeros_like(q), lse
    o, lse_rest = _forward(_rows(q, 1), _rows(k, 0, s - 1), _rows(v, 0, s - 1), "causal",
                           backend, scale)
    return _pad_rows(o, 1, 0), F.pad(lse_rest.to(acc_dtype(q.dtype)), (1, 0), value=float("-inf"))


# narrow(), pad() and clone() rather than [] indexing, copy_() and contiguous(): the tests run these
# CUDA paths on fake CUDA tensors, which a CPU-only torch cannot index with [], copy_ into or make
# contiguous (each wants a CUDA device guard)
def _rows(t: torch.Tensor, start: int, stop: int | None = None) -> torch.Tensor:
    """t[:, start:stop] (sequence rows of a bshd tensor)."""
    stop = t.shape[1] if stop is None else stop
    return t.narrow(1, start, stop - start)


def _contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.clone(memory_format=torch.contiguous_format)


def _pad_rows(t: torch.Tensor, before: int, after: int) -> torch.Tensor:
    """t (bshd) with zero rows added before and after its sequence rows."""
    return F.pad(t, (0, 0, 0, 0, before, after))


def _expand_kv(t: torch.Tensor, heads: int) -> torch.Tensor:
    group = heads // t.shape[2]
    return t if group == 1 else t.repeat_interleave(group, dim=2)


def _reduce_kv(grad: torch.Tensor, kv_heads: int) -> torch.Tensor:
    b, s, h, d = grad.shape
    return grad if h == kv_heads else grad.view(b, s, kv_heads, h // kv_heads, d).sum(3)


def _math_scores(q, k, causal, scale, keep=None):
    work = acc_dtype(q.dtype)
    kx = _expand_kv(k, q.shape[2]).to(work)
    scores = torch.einsum("bqhd,bkhd->bhqk", q.to(work), kx) * scale
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        keep = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    return scores


def _safe(lse: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)


def _additive(keep: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A boolean mask as the additive mask (0 / -inf, the query's dtype) the CPU kernel takes."""
    if keep is None:
        return None
    return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill(~keep, float("-inf"))


def _math_forward(q, k, v, causal, scale, keep=None):
    scores = _math_scores(q, k, causal, scale, keep)
    lse = torch.logsumexp(scores, dim=-1)
    p = torch.exp(scores - _safe(lse).unsqueeze(-1))
    out = torch.einsum("bhqk,bkhd->bqhd", p, _expand_kv(v, q.shape[2]).to(p.dtype))
    return out.to(q.dtype), lse


def _torch_forward(q, k, v, causal, scale, keep=None):
    h = q.shape[2]
    qt, kt, vt = (t.transpose(1, 2) for t in (q, _expand_kv(k, h), _expand_kv(v, h)))
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


def _flash_forward(q, k, v, causal, scale, window=(-1, -1)):
    _check_square(q, k, causal)
    # flash_attn_func pads the head dim to a multiple of 8 itself and, with return_attn_probs,
    # returns (out, softmax_lse (B, H, Sq) float32, S_dmask) in 2.5 .. 2.8
    out, lse, _ = _flash_attn().flash_attn_func(q, k, v, softmax_scale=scale, causal=causal,
                                                window_size=window, return_attn_probs=True)
    return out, lse.float()


def _check_square(q, k, causal):
    """flash-attn aligns a causal mask bottom-right when Sq != Sk; 'causal' here is top-left
    (query i sees keys j <= i). They agree on square blocks, the only causal blocks layouts plan."""
    if causal and q.shape[1] != k.shape[1]:
        raise ValueError(f"flash backend: a causal block must be square, got Sq={q.shape[1]} "
                         f"Sk={k.shape[1]}")


# --------------------------------------------------------------------------------------- backward
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
    backend = resolve_backend(backend, q.device, q.dtype, head_dim=q.shape[-1])
    _record(q, k, mask, 2.5, band)
    if mask == "band":
        sq, sk = q.shape[1], k.shape[1]
        if backend == "flash":
            return _flash_backward(dout, q, k, v, out, lse, False, scale,
                                   window=_flash_window(sq, sk, band))
        tiles = band_tiles(sq, sk, band)
        if len(tiles) == 1:
            return _band_dense_backward(dout, q, k, v, out, lse, band, backend, scale)
        return _band_tiled_backward(dout, q, k, v, out, lse, tiles, backend, scale)
    return _backward(dout, q, k, v, out, lse, mask, backend, scale)


def _band_dense_backward(dout, q, k, v, out, lse, band, backend, scale):
    keep = band_keep(q.shape[1], k.shape[1], band, q.device)
    if backend == "torch" and q.device.type == "cpu":
        return _torch_backward(dout, q, k, v, out, lse, False, scale, keep)
    return _math_backward(dout, q, k, v, out, lse, False, scale, keep)


def _band_tiled_backward(dout, q, k, v, out, lse, tiles, backend, scale):
    """Gradients of a band run as `band_tiles`: dq tile by tile, dk and dv summed over the tiles
    whose keys overlap, in the accumulation dtype."""
    work = acc_dtype(q.dtype)
    dqs = []
    dk = torch.zeros(k.shape, dtype=work, device=k.device)
    dv = torch.zeros(v.shape, dtype=work, device=v.device)
    for r0, r1, c0, c1, tile_band in tiles:
        if c1 <= c0:
            dqs.append(torch.zeros_like(_rows(q, r0, r1)))
            continue
        gq, gk, gv = _band_dense_backward(
            _rows(dout, r0, r1), _rows(q, r0, r1), _rows(k, c0, c1), _rows(v, c0, c1),
            _rows(out, r0, r1), lse.narrow(2, r0, r1 - r0), tile_band, backend, scale)
        dqs.append(gq)
        _rows(dk, c0, c1).add_(gk)
        _rows(dv, c0, c1).add_(gv)
    return torch.cat(dqs, dim=1), dk.to(k.dtype), dv.to(v.dtype)


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
    if s == 1:
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    gq, gk, gv = _backward(_rows(dout, 1), _rows(q, 1), _rows(k, 0, s - 1), _rows(v, 0, s - 1),
                           _rows(out, 1), lse.narrow(2, 1, s - 1), "causal", backend, scale)
    return _pad_rows(gq, 1, 0), _pad_rows(gk, 0, 1), _pad_rows(gv, 0, 1)


def _math_backward(dout, q, k, v, out, lse, causal, scale, keep=None):
    h, hkv = q.shape[2], k.shape[2]
    scores = _math_scores(q, k, causal, scale, keep)
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


def _torch_backward(dout, q, k, v, out, lse, causal, scale, keep=None):
    h, hkv = q.shape[2], k.shape[2]
    qt, kt, vt = (t.transpose(1, 2) for t in (q, _expand_kv(k, h), _expand_kv(v, h)))
    dot, ot = dout.transpose(1, 2), out.transpose(1, 2)
    if q.device.type == "cpu":
        lse_k = _safe(lse).to(torch.float64 if q.dtype == torch.float64 else torch.float32)
        lse_k = lse_k.contiguous()
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dot, qt, kt, vt, ot, lse_k, 0.0, causal, attn_mask=_additive(keep, q.dtype),
            scale=scale)
    else:
        dq, dk, dv, _ = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
            dot, qt, kt, vt, None, ot, efficient_lse(lse), torch.tensor(0), torch.tensor(0),
            0.0, [True, True, True, False], causal, scale=scale)
    dq, dk, dv = (t.transpose(1, 2) for t in (dq, dk, dv))
    return dq, _reduce_kv(dk, hkv), _reduce_kv(dv, hkv)


def efficient_lse(lse: torch.Tensor) -> torch.Tensor:
    """lse (B, H, Sq) laid out as the memory-efficient forward returns it, the layout its backward
    takes: float32 (B, H, ceil(Sq / 32) * 32) on CUDA (the kernel requires its head and batch
    strides to be multiples of 8: an lse of stride Sq fails for most Sq), (B, H, Sq) on ROCm."""
    sq = lse.shape[-1]
    width = sq if torch.version.hip else -(-sq // 32) * 32
    return F.pad(lse.float(), (0, width - sq))


def _flash_backward(dout, q, k, v, out, lse, causal, scale, window=(-1, -1)):
    """flash-attn's `_flash_attn_backward`, called as flash_attn_func's backward calls it: q, k,
    v, out (and dout) with the head dim padded to a multiple of 8, dq, dk, dv allocated padded and
    sliced back."""
    _check_square(q, k, causal)
    return _padded_backward(_flash_attn()._flash_attn_backward, "_flash_attn_backward", dout, q, k,
                            v, out, lse, causal, scale, window, {})


def _padded_backward(fn, name, dout, q, k, v, out, lse, causal, scale, window, extra):
    """Call a flash-attn backward (dense or varlen: `extra` holds the varlen arguments) on inputs
    with the head dim padded to a multiple of 8; dq, dk, dv sliced back to the head dim."""
    d = q.shape[-1]
    dout_p, q_p, k_p, v_p, out_p = (_pad_head_dim(t) for t in (dout, q, k, v, out))
    dq, dk, dv = torch.empty_like(q_p), torch.empty_like(k_p), torch.empty_like(v_p)
    known = {
        "dout": dout_p, "q": q_p, "k": k_p, "v": v_p, "out": out_p,
        "softmax_lse": _contiguous(lse.float()), "dq": dq, "dk": dk, "dv": dv,
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


def _pad_head_dim(t: torch.Tensor) -> torch.Tensor:
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


# ------------------------------------------------------------------------ packed sequences (varlen)
@dataclass(frozen=True)
class Varlen:
    """Sequence boundaries of one flash-attn varlen call: cumulative query and key lengths [0, ...,
    T] (int32, on the inputs' device, built once per plan: no host-to-device copy per call) and the
    longest query and key sequence (host ints: flash-attn sizes its grid by them)."""

    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int


def flash_varlen_supported() -> bool:
    """Whether the installed flash-attn's varlen calls take the packed (H, Tq) lse: >= 2.6 (before,
    varlen padded it to (sequences, H, max_seqlen_q), flash-attn PR #970)."""
    if _flash_attn() is None:
        return False
    return _version_at_least(getattr(sys.modules.get("flash_attn"), "__version__", ""), (2, 6))


@cache
def _version_at_least(version: str, least: tuple[int, int]) -> bool:
    found = re.match(r"(\d+)\.(\d+)", version)
    return found is not None and (int(found[1]), int(found[2])) >= least


def flash_varlen_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqs: Varlen,
                         causal: bool, window: tuple[int, int], scale: float
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (Tq, H, D), lse (H, Tq) float32) of packed sequences (no FLOPs booked: see module doc).
    flash_attn_varlen_func pads the head dim itself and, with return_attn_probs, returns (out,
    softmax_lse, S_dmask) in 2.6 .. 2.8."""
    out, lse, _ = _flash_attn().flash_attn_varlen_func(
        q, k, v, seqs.cu_q, seqs.cu_k, seqs.max_q, seqs.max_k, softmax_scale=scale, causal=causal,
        window_size=window, return_attn_probs=True)
    return out, lse.float()


def flash_varlen_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          out: torch.Tensor, lse: torch.Tensor, seqs: Varlen, causal: bool,
                          window: tuple[int, int], scale: float
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of packed sequences given the final out and lse (H, Tq): flash-attn's
    `_flash_attn_varlen_backward` bound by name (a custom op's schema in >= 2.7), head dim padded."""
    extra = {"cu_seqlens_q": seqs.cu_q, "cu_seqlens_k": seqs.cu_k, "max_seqlen_q": seqs.max_q,
             "max_seqlen_k": seqs.max_k}
    return _padded_backward(_flash_attn()._flash_attn_varlen_backward,
                            "_flash_attn_varlen_backward", dout, q, k, v, out, lse, causal, scale,
                            window, extra)
