"""A rank's device: which local CUDA index is its GPU, and how its process group binds to it.

Pure functions (no CUDA needed to call them), used by the Ray rank actor and the local gang:
`cuda_index` maps the GPU ids a scheduler assigned to a torch device index; `process_group_kwargs`
is what `torch.distributed.init_process_group` gets besides the rendezvous: NCCL with `device_id`
on CUDA (the communicator is created eagerly, bound to that GPU, so sub-groups split from it and a
barrier knows its device), gloo on CPU.
"""

from __future__ import annotations

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


def process_group_kwargs(device: str, index: int | None = None) -> dict[str, Any]:
    """Backend (and on CUDA the bound device) for init_process_group on `device` ('cpu' | 'cuda')."""
    if device == "cuda":
        import torch

        if index is None:
            raise SeqparError("device='cuda': a process group needs its rank's GPU index")
        return {"backend": "nccl", "device_id": torch.device("cuda", index)}
    return {"backend": "gloo"}
