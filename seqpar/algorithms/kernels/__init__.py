"""Local attention that also returns the log-sum-exp, and its backward.

`attend(q, k, v, mask) -> (out, lse)` with q (B, Sq, H, D), k and v (B, Sk, Hkv, D) ("bshd"),
out (B, Sq, H, D) and lse (B, H, Sq). GQA (Hkv < H) is handled here, inside the kernel: query head h
reads key/value head h // (H / Hkv). K and V are never expanded before communication.

Masks: 'full'; 'causal' (top-left aligned: query i sees keys j <= i); 'shifted' (query i sees keys
j < i, the stripe layout's block above the diagonal); 'band' with `band=(a, b)` (query i sees keys j
with a <= j - i < b: a sliding window's block, or a document's lower edge). The FlashAttention-2
kernels (flash-attn, torch's own flash kernel) run a band through their `window_size` (bottom-right
aligned: left = Sk - Sq - a, right = b - 1 - (Sk - Sq)); aten's CPU flash kernel through an explicit
boolean mask; elsewhere the math kernel with that mask. A band much narrower than its block runs
there as row tiles, each against only the keys it sees (`band_tiles`). A query that sees no key
gets lse = -inf and out = 0. lse is float64 for float64 inputs and float32 otherwise.

Backends: 'flash' (flash-attn 2 on CUDA), 'torch' (aten's kernels: on CUDA torch's own
FlashAttention-2 where it runs — fp16/bf16, head dim <= 256, sm80+ — with native GQA, windows and
packed sequences, else the memory-efficient kernel; on the CPU its flash kernel), 'cudnn' (cuDNN's
fused attention for dense blocks; bands and packed sequences on torch's flash kernel), 'math'
(explicit float32/float64 reference). 'auto' picks flash on CUDA where flash-attn 2 runs
(installed; fp16/bf16; head dim <= 256; compute capability 8.x or 9.0), else torch's kernels where
they take the dtype, else math. `kernel_name` names the kernel a call runs (what a trial records);
an installed flash-attn that does not import says why once (`flash_import_error`).

Packed sequences (`VARLEN_FORWARD` / `VARLEN_BACKWARD` by kernel; flash-attn's are
`flash_varlen_forward` / `flash_varlen_backward`): the varlen entry points run many (query range,
key range) pairs in one call: q (Tq, H, D), k and v (Tk, Hkv, D) concatenated sequence by sequence,
`Varlen` their int32 boundaries on the device and longest lengths; causal and window_size apply per
sequence, aligned bottom-right. The lse is (H, Tq) float32 in and out, the layout torch's kernel and
flash-attn >= 2.6 use (2.5 pads it per sequence: `flash_varlen_supported` says no there). `blocks`
groups a block's tasks into these calls; FLOPs are booked per task (`book_flops`).

The package, by concern: `flops` (FLOP accounting), `capability` (which backend and kernel run),
`dispatch` (attend / attend_backward by mask), `engines` (each kernel's entry points), the kernels
`flash` (flash-attn), `torch_flash`, `cudnn`, `aten` (CPU flash, memory-efficient) and
`math_kernel`, `bands` (band blocks and their row tiles), `binding` (flash-attn's backward arguments
by name), `tensors`.
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
