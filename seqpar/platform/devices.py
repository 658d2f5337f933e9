"""A rank's device: which local CUDA index is its GPU, and how its process group binds to it.

Pure functions (no CUDA needed to call them), used by the Ray rank actor and the local gang:
`cuda_index` maps the GPU ids a scheduler assigned to a torch device index; `process_group_kwargs`
is what `torch.distributed.init_process_group` gets besides the rendezvous: NCCL with `device_id`
on CUDA (the communicator is created eagerly, bound to that GPU, so sub-groups split from it and a
barrier knows its device), gloo on CPU; `NCCL_WATCHDOG_ENV` what an NCCL rank's process group runs
with unless the rank's environment says otherwise. `peak_flops` is a device's datasheet peak (for
MFU).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from seqpar.errors import SeqparError


def cuda_index(gpu_ids: Sequence[int | str], visible: str | None) -> int:
    """The torch index of the first GPU in `gpu_ids` (e.g. `ray.get_gpu_ids()`) given this
    process's CUDA_VISIBLE_DEVICES (`visible`): its position in that list (Ray sets it to the
    assigned ids, so usually 0), or the id itself when the variable is unset or empty (Ray with
    RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES)."""
    if not gpu_ids:
        raise SeqparError("device='cuda': no GPU is assigned to this rank")
    first = str(gpu_ids[0]).strip()
    if not visible or not visible.strip():
        return int(first)
    listed = [v.strip() for v in visible.split(",")]
    if first not in listed:
        raise SeqparError(f"GPU {first} assigned to this rank is not in "
                          f"CUDA_VISIBLE_DEVICES={visible!r}")
    return listed.index(first)


# NCCL's watchdog, explicit (torch's default is 3: tear the process down without aborting the
# communicator). 1: on an NCCL error or a collective past the process group's timeout (the trial's
# timeout x 2 + 10 s: the driver's own deadline comes first), abort the communicator, so the peers
# fail instead of hanging, and end the process; Ray then reports the rank dead. A variable the
# driver or the sweep sets (connection.COMM_ENV_VARS) wins.
NCCL_WATCHDOG_ENV = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}


def process_group_kwargs(device: str, index: int | None = None) -> dict[str, Any]:
    """Backend (and on CUDA the bound device) for init_process_group on `device` ('cpu' | 'cuda')."""
    if device == "cuda":
        import torch

        if index is None:
            raise SeqparError("device='cuda': a process group needs its rank's GPU index")
        return {"backend": "nccl", "device_id": torch.device("cuda", index)}
    return {"backend": "gloo"}


# Dense (no sparsity) tensor-core peak FLOP/s of one device for fp16/bf16 inputs, from the vendors'
# datasheets (a sheet that gives only "with sparsity" figures is halved), matched by the whole name
# torch.cuda.get_device_name reports. Names that differ by a letter are different devices (L4 vs
# L40 vs L40S, A10 vs A10G, H100 SXM vs PCIe vs NVL); an unlisted name (A10G: no NVIDIA datasheet),
# and float32 (SIMT FP32, TF32 or 3xTF32 depending on the kernel) get no MFU rather than a wrong one.
_SXM_HOPPER = {"bfloat16": 989.5e12, "float16": 989.5e12}    # 1,979 TF with sparsity
_PCIE_HOPPER = {"bfloat16": 756.5e12, "float16": 756.5e12}   # 1,513
_NVL_HOPPER = {"bfloat16": 835.5e12, "float16": 835.5e12}    # 1,671
_A100 = {"bfloat16": 312e12, "float16": 312e12}              # every A100/A800, SXM4 and PCIe
PEAK_FLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    (r"NVIDIA H100 80GB HBM3", _SXM_HOPPER),
    (r"NVIDIA H100 PCIe", _PCIE_HOPPER),
    (r"NVIDIA H100 NVL", _NVL_HOPPER),
    (r"NVIDIA H800( 80GB HBM3)?", _SXM_HOPPER),
    (r"NVIDIA H800 PCIe", _PCIE_HOPPER),
    (r"NVIDIA H200", _SXM_HOPPER),
    (r"NVIDIA H200 NVL", _NVL_HOPPER),
    (r"NVIDIA A[18]00-SXM4-(40|80)GB", _A100),
    (r"NVIDIA A[18]00-PCIE-40GB|NVIDIA A[18]00 (40|80)GB PCIe", _A100),
    (r"NVIDIA A10", {"bfloat16": 125e12, "float16": 125e12}),
    (r"NVIDIA A30", {"bfloat16": 165e12, "float16": 165e12}),
    (r"NVIDIA A40", {"bfloat16": 149.7e12, "float16": 149.7e12}),
    (r"NVIDIA L4", {"bfloat16": 121e12, "float16": 121e12}),              # 242 with sparsity
    (r"NVIDIA L40", {"bfloat16": 181.05e12, "float16": 181.05e12}),       # 362.1
    (r"NVIDIA L40S", {"bfloat16": 366.5e12, "float16": 366.5e12}),        # 733
    (r"Tesla V100-SXM2-(16|32)GB", {"float16": 125e12}),
    (r"Tesla V100-PCIE-(16|32)GB", {"float16": 112e12}),
    (r"Tesla V100S-PCIE-32GB", {"float16": 130e12}),
    (r"Tesla T4", {"float16": 65e12}),
)


def peak_flops(device_name: str, dtype: str) -> float | None:
    """The dense peak FLOP/s of one `device_name` for `dtype` inputs, or None when not known."""
    for pattern, peaks in PEAK_FLOPS:
        if re.fullmatch(pattern, device_name.strip()):
            return peaks.get(dtype)
    return None
