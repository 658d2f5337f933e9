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

The package, by concern: `flops` (FLOP accounting), `capability` (which backend runs), `dispatch`
(attend / attend_backward by mask), the backends `flash`, `aten` and `math_kernel`, `bands` (band
blocks and their row tiles), `binding` (flash-attn's backward arguments by name), `tensors`.
"""

from seqpar.algorithms.kernels.aten import efficient_lse
from seqpar.algorithms.kernels.bands import BAND_TILE, band_keep, band_tiles
from seqpar.algorithms.kernels.binding import op_parameters
from seqpar.algorithms.kernels.capability import (
    BACKENDS,
    FLASH_MAX_HEAD_DIM,
    flash_attn,
    flash_unsupported,
    flash_varlen_supported,
    kernel_name,
    resolve_backend,
)
from seqpar.algorithms.kernels.dispatch import MASKS, attend, attend_backward
from seqpar.algorithms.kernels.flash import (
    Side,
    Varlen,
    flash_varlen_backward,
    flash_varlen_forward,
    window_sides,
)
from seqpar.algorithms.kernels.flops import BACKWARD_FLOPS, attention_flops, band_pairs, book_flops
from seqpar.algorithms.kernels.tensors import acc_dtype, contiguous, default_scale

__all__ = ["BACKENDS", "BACKWARD_FLOPS", "BAND_TILE", "FLASH_MAX_HEAD_DIM", "MASKS", "Side", "Varlen",
           "acc_dtype", "attend", "attend_backward", "attention_flops", "band_keep", "band_pairs",
           "band_tiles", "book_flops", "contiguous", "default_scale", "efficient_lse", "flash_attn",
           "flash_unsupported", "flash_varlen_backward", "flash_varlen_forward",
           "flash_varlen_supported", "kernel_name", "op_parameters", "resolve_backend", "window_sides"]
