"""Local attention that also returns the log-sum-exp, and its backward.

`attend(q, k, v, mask) -> (out, lse)` with q and k (B, S, H or Hkv, D), v (B, Sk, Hkv, Dv)
("bshd"; Dv = D but for MLA), out (B, Sq, H, Dv) and lse (B, H, Sq); GQA is handled here, inside
the kernel (query head h reads key/value head h // (H / Hkv)), never before communication. Masks:
'full'; 'causal' (top-left aligned: query i sees keys j <= i); 'shifted' (j < i: the stripe
layout's block above the diagonal); 'band' with `band=(a, b)` (a <= j - i < b: a window's block,
or a document's lower edge; the FlashAttention-2 kernels run it through `window_size`, bottom-right
aligned: left = Sk - Sq - a, right = b - 1 - (Sk - Sq)). A fused kernel takes one head dim: a
narrower V (or Q/K) is zero-padded to the wider (`tensors.one_width_forward`). A query that sees
no key gets lse = -inf and out = 0; lse is float64 for float64 inputs, float32 otherwise.

Packed sequences (`VARLEN_FORWARD` / `VARLEN_BACKWARD` by kernel) run many (query range, key range)
pairs in one call: q (Tq, H, D), k and v (Tk, Hkv, D) concatenated, `Varlen` their int32 boundaries
on the device; lse (H, Tq) float32 (flash-attn >= 2.6's layout: `flash_varlen_supported`). `blocks`
groups a block's tasks into these calls; FLOPs are booked per task (`book_flops`).

The package, by concern: `flops`, `capability` (which backend and kernel run: `kernel_name`,
`flash_import_error`), `dispatch` (attend / attend_backward by mask), `engines`, the kernels `flash`,
`torch_flash`, `cudnn`, `aten`, `math_kernel`, `bands` (band tiles), `binding`, `tensors`. The
backends (auto | flash | torch | cudnn | math) and where each runs: docs/gpus.md.
"""

from seqpar.algorithms.kernels.aten import efficient_lse
from seqpar.algorithms.kernels.bands import BAND_TILE, band_keep, band_tiles
from seqpar.algorithms.kernels.binding import op_parameters
from seqpar.algorithms.kernels.capability import (
    BACKENDS,
    FLASH_MAX_HEAD_DIM,
    KERNELS,
    cudnn_unsupported,
    flash_attn,
    flash_import_error,
    flash_unsupported,
    flash_varlen_supported,
    kernel_name,
    kernel_of,
    resolve_backend,
    torch_flash_unsupported,
    window_kernel,
)
from seqpar.algorithms.kernels.dispatch import MASKS, attend, attend_backward
from seqpar.algorithms.kernels.engines import VARLEN_BACKWARD, VARLEN_FORWARD
from seqpar.algorithms.kernels.flash import (
    Side,
    Varlen,
    flash_varlen_backward,
    flash_varlen_forward,
    window_sides,
)
from seqpar.algorithms.kernels.flops import BACKWARD_FLOPS, attention_flops, band_pairs, book_flops
from seqpar.algorithms.kernels.tensors import acc_dtype, contiguous, default_scale

__all__ = ["BACKENDS", "BACKWARD_FLOPS", "BAND_TILE", "FLASH_MAX_HEAD_DIM", "KERNELS", "MASKS", "Side",
           "VARLEN_BACKWARD", "VARLEN_FORWARD", "Varlen", "acc_dtype", "attend", "attend_backward",
           "attention_flops", "band_keep", "band_pairs", "band_tiles", "book_flops", "contiguous",
           "cudnn_unsupported", "default_scale", "efficient_lse", "flash_attn", "flash_import_error",
           "flash_unsupported", "flash_varlen_backward", "flash_varlen_forward",
           "flash_varlen_supported", "kernel_name", "kernel_of", "op_parameters", "resolve_backend",
           "torch_flash_unsupported", "window_kernel", "window_sides"]
