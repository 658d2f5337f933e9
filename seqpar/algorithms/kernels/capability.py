"""Which backend runs: flash-attn 2 where it runs (installed; fp16/bf16; head dim <= 256; compute
capability 8.x or 9.0), else torch's kernels where they take the dtype, else math; and whether the
installed flash-attn's varlen calls take the packed lse."""

from __future__ import annotations

import re
import sys
from functools import cache, lru_cache

import torch

from seqpar.errors import require

BACKENDS = ("auto", "flash", "torch", "math")


@lru_cache(maxsize=1)
def flash_attn():
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
    if flash_attn() is None:
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


def kernel_name(backend: str, device: torch.device, dtype: torch.dtype = torch.float32, *,
                head_dim: int | None = None) -> str:
    """The attention kernel a call of `backend` runs on `device` for `dtype`, by name, as a trial
    records it per rank: 'flash-attn <version>', 'torch-cpu-flash' (aten's CPU flash kernel),
    'torch-efficient' (aten's memory-efficient CUDA kernel) or 'math'."""
    resolved = resolve_backend(backend, device, dtype, head_dim=head_dim)
    if resolved == "flash":
        version = getattr(sys.modules.get("flash_attn"), "__version__", "?")
        return f"flash-attn {version}"
    if resolved == "torch":
        return "torch-efficient" if device.type == "cuda" else "torch-cpu-flash"
    return "math"


def _torch_cuda_takes(device: torch.device, dtype: torch.dtype) -> bool:
    """The memory-efficient kernel has fp32 and fp16 kernels from sm50, bf16 ones from sm80, and
    no float64 ones."""
    if dtype == torch.float64:
        return False
    return dtype != torch.bfloat16 or _capability(device)[0] >= 8


def flash_varlen_supported() -> bool:
    """Whether the installed flash-attn's varlen calls take the packed (H, Tq) lse: >= 2.6 (before,
    varlen padded it to (sequences, H, max_seqlen_q), flash-attn PR #970)."""
    if flash_attn() is None:
        return False
    return _version_at_least(getattr(sys.modules.get("flash_attn"), "__version__", ""), (2, 6))


@cache
def _version_at_least(version: str, least: tuple[int, int]) -> bool:
    found = re.match(r"(\d+)\.(\d+)", version)
    return found is not None and (int(found[1]), int(found[2])) >= least
