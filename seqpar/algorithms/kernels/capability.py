"""Which backend and kernel run: flash-attn 2 where it runs (installed; fp16/bf16; head dim <= 256;
compute capability 8.x or 9.0), else torch's kernels where they take the dtype (torch's own flash
kernel on sm80+ in fp16/bf16, else the memory-efficient one), else math; 'cudnn' asks for cuDNN's
fused attention. `kernel_name` names the kernel a call runs; `flash_import_error` says why an
installed flash-attn does not import; whether the installed flash-attn's varlen calls take the
packed lse."""

from __future__ import annotations

import logging
import re
import sys
from functools import cache, lru_cache

import torch

from seqpar.errors import require
from seqpar.rules.options import BACKENDS


@lru_cache(maxsize=1)
def flash_attn():
    """flash-attn's interface module, or None. An installed flash-attn that does not import (a
    wheel built for another torch or CUDA: ImportError, undefined symbol) says why, once."""
    _import_error.clear()
    try:
        import flash_attn.flash_attn_interface as fa  # type: ignore[import-not-found]
    except ModuleNotFoundError as err:
        if err.name not in ("flash_attn", "flash_attn.flash_attn_interface"):
            _broken(err)
        return None
    except Exception as err:  # noqa: BLE001 (any failure of an installed package's import)
        _broken(err)
        return None
    return fa


_import_error: list[str] = []  # why an installed flash-attn does not import (at most one entry)


def _broken(err: BaseException) -> None:
    why = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}".strip()
    _import_error.append(why)
    logging.getLogger("seqpar.kernels").warning(
        "flash-attn is installed but does not import (%s); attention runs on torch's kernels", why)


def flash_import_error() -> str | None:
    """Why an installed flash-attn does not import, or None (absent, or it imports)."""
    flash_attn()
    return _import_error[0] if _import_error else None


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
    why = _sixteen_bit_cuda(device, dtype, head_dim, "flash-attn 2")
    if why is not None:
        return why
    major, minor = _capability(device)
    if not _supports_flash(major, minor):
        return (f"needs compute capability 8.x or 9.0 (Ampere, Ada, Hopper); {device} is "
                f"sm_{major}{minor}")
    if flash_attn() is None:
        broken = flash_import_error()
        return (f"flash-attn is installed but does not import ({broken})" if broken
                else "needs the flash-attn package (pip install seqpar[gpu])")
    return None


def _sixteen_bit_cuda(device: torch.device, dtype: torch.dtype, head_dim: int | None,
                      kernel: str, max_head_dim: int = FLASH_MAX_HEAD_DIM) -> str | None:
    if device.type != "cuda":
        return f"needs a CUDA device, not {device.type}"
    if dtype not in (torch.float16, torch.bfloat16):
        return f"takes float16/bfloat16 inputs, not {str(dtype).removeprefix('torch.')}"
    if head_dim is not None and head_dim > max_head_dim:
        return f"takes head_dim <= {max_head_dim} in {kernel}, not {head_dim}"
    return None


def torch_flash_unsupported(device: torch.device, dtype: torch.dtype,
                            head_dim: int | None = None) -> str | None:
    """Why torch's own FlashAttention-2 (`aten._flash_attention_forward`) cannot run this call, or
    None: it needs a torch built with it, fp16/bf16, head dim <= 256 and sm80 or newer."""
    why = _sixteen_bit_cuda(device, dtype, head_dim, "torch's flash kernel")
    if why is not None:
        return why
    if not _torch_flash_built():
        return "this torch was built without its flash attention kernels"
    major, minor = _capability(device)
    return None if major >= 8 else f"needs sm80 or newer; {device} is sm_{major}{minor}"


CUDNN_MAX_HEAD_DIM = 128  # cuDNN 9's fused attention on Ampere (Hopper takes more)


def cudnn_unsupported(device: torch.device, dtype: torch.dtype,
                      head_dim: int | None = None) -> str | None:
    """Why cuDNN's fused attention cannot run this call, or None: cuDNN 9 or newer, fp16/bf16,
    head dim <= 128 and a multiple of 8, sm80 or newer."""
    why = _sixteen_bit_cuda(device, dtype, head_dim, "cuDNN attention", CUDNN_MAX_HEAD_DIM)
    if why is not None:
        return why
    if head_dim is not None and head_dim % 8:
        return f"takes a head_dim that is a multiple of 8 in cuDNN attention, not {head_dim}"
    if _cudnn_version() < 90000:
        return "needs cuDNN 9 or newer with torch's cuDNN attention"
    major, minor = _capability(device)
    return None if major >= 8 else f"needs sm80 or newer; {device} is sm_{major}{minor}"


def _torch_flash_built() -> bool:
    return bool(torch.backends.cuda.is_flash_attention_available())


def _cudnn_version() -> int:
    return (torch.backends.cudnn.version() or 0) if torch.backends.cudnn.is_available() else 0


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
    if backend == "cudnn":
        why = cudnn_unsupported(device, dtype, head_dim)
        require(why is None, "backend", backend, str(why))
    if backend == "torch" and cuda:
        require(_torch_cuda_takes(device, dtype), "backend", backend,
                f"torch's CUDA attention kernels do not take {str(dtype).removeprefix('torch.')} "
                f"on {device}; use 'math' or 'auto'")
    return backend


# the kernels a call can run, by name (`kernel_of`; `kernel_name` adds flash-attn's version)
KERNELS = ("flash-attn", "torch-flash", "torch-cudnn", "torch-efficient", "torch-cpu-flash", "math")


def kernel_of(backend: str, device: torch.device, dtype: torch.dtype = torch.float32, *,
              head_dim: int | None = None) -> str:
    """The kernel a dense block of `backend` runs (one of KERNELS): 'torch' on CUDA is torch's
    flash kernel where it runs, else the memory-efficient one; 'torch' on the CPU is aten's CPU
    flash kernel."""
    resolved = resolve_backend(backend, device, dtype, head_dim=head_dim)
    if resolved == "flash":
        return "flash-attn"
    if resolved == "cudnn":
        return "torch-cudnn"
    if resolved == "torch":
        if torch_flash_unsupported(device, dtype, head_dim) is None:
            return "torch-flash"
        return "torch-efficient" if device.type == "cuda" else "torch-cpu-flash"
    return "math"


def window_kernel(kernel: str, device: torch.device, dtype: torch.dtype,
                  head_dim: int | None = None) -> str | None:
    """The FlashAttention-2 kernel that runs band blocks (window_size) and packed sequences for a
    call whose dense kernel is `kernel`: flash-attn itself, or torch's flash kernel (also under
    'cudnn', which takes neither), else None (explicit masks, row tiles)."""
    if kernel in ("flash-attn", "torch-flash"):
        return kernel
    if kernel == "torch-cudnn" and torch_flash_unsupported(device, dtype, head_dim) is None:
        return "torch-flash"
    return None


def kernel_name(backend: str, device: torch.device, dtype: torch.dtype = torch.float32, *,
                head_dim: int | None = None) -> str:
    """The attention kernel a call of `backend` runs on `device` for `dtype`, by name, as a trial
    records it per rank: 'flash-attn <version>', 'torch-flash' (torch's own FlashAttention-2),
    'torch-cudnn' (cuDNN's fused attention), 'torch-efficient' (aten's memory-efficient CUDA
    kernel), 'torch-cpu-flash' (aten's CPU flash kernel) or 'math'. 'auto' names what it chose."""
    kernel = kernel_of(backend, device, dtype, head_dim=head_dim)
    if kernel == "flash-attn":
        version = getattr(sys.modules.get("flash_attn"), "__version__", "?")
        return f"flash-attn {version}"
    return kernel


def _torch_cuda_takes(device: torch.device, dtype: torch.dtype) -> bool:
    """torch's CUDA kernels: the memory-efficient one has fp32 and fp16 kernels from sm50, bf16 ones
    from sm80 (where the flash kernel runs too), and no float64 ones."""
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
