"""A rank's GPU index and its process-group arguments: the CUDA set-up, checked without CUDA."""

from __future__ import annotations

import pytest
import torch

from seqpar.errors import SeqparError
from seqpar.platform.devices import cuda_index, process_group_kwargs


@pytest.mark.parametrize(("gpu_ids", "visible", "index"), [
    ([3], "3", 0),            # Ray's default: CUDA_VISIBLE_DEVICES is the assigned GPU
    (["3"], "3", 0),
    ([5], "4,5,6", 1),        # a node started with a narrower CUDA_VISIBLE_DEVICES
    ([2, 3], "2,3", 0),       # two GPUs for one rank: the first
    ([2], None, 2),           # RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES: the physical id
    ([2], "", 2),
    (["GPU-6f1c"], "GPU-aa01, GPU-6f1c", 1),  # UUIDs
])
def test_cuda_index_is_the_assigned_gpus_position_among_the_visible_ones(gpu_ids, visible, index):
    assert cuda_index(gpu_ids, visible) == index


def test_cuda_index_without_a_gpu_or_with_an_invisible_one_is_an_error():
    with pytest.raises(SeqparError, match="no GPU"):
        cuda_index([], "0")
    with pytest.raises(SeqparError, match="not in CUDA_VISIBLE_DEVICES"):
        cuda_index([7], "0,1")


def test_process_group_binds_nccl_to_the_ranks_gpu_and_cpu_to_gloo():
    assert process_group_kwargs("cuda", 2) == {"backend": "nccl",
                                               "device_id": torch.device("cuda", 2)}
    assert process_group_kwargs("cpu") == {"backend": "gloo"}
    with pytest.raises(SeqparError):
        process_group_kwargs("cuda")


def test_nccl_ranks_abort_on_a_watchdog_error_unless_the_driver_says_otherwise():
    from seqpar.platform.connection import COMM_ENV_VARS, comm_env
    from seqpar.platform.devices import NCCL_WATCHDOG_ENV

    # explicit, not torch's default (3: end the process without aborting the communicator)
    assert NCCL_WATCHDOG_ENV == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
    # the driver's own value reaches the ranks (a forwarded variable), where setdefault keeps it
    assert set(NCCL_WATCHDOG_ENV) <= set(COMM_ENV_VARS)
    assert comm_env({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"})["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"
