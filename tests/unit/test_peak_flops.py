"""The MFU peak table: whole device names as torch.cuda.get_device_name reports them."""

from __future__ import annotations

import pytest

from seqpar.platform.devices import peak_flops


@pytest.mark.parametrize(("name", "dtype", "peak"), [
    ("NVIDIA H100 80GB HBM3", "bfloat16", 989.5e12),   # SXM5
    ("NVIDIA H100 PCIe", "bfloat16", 756.5e12),
    ("NVIDIA H100 NVL", "float16", 835.5e12),
    ("NVIDIA H800", "bfloat16", 989.5e12),
    ("NVIDIA H200", "bfloat16", 989.5e12),
    ("NVIDIA A100-SXM4-80GB", "bfloat16", 312e12),
    ("NVIDIA A100-SXM4-40GB", "float16", 312e12),
    ("NVIDIA A100-PCIE-40GB", "bfloat16", 312e12),
    ("NVIDIA A100 80GB PCIe", "bfloat16", 312e12),
    ("NVIDIA A800-SXM4-80GB", "bfloat16", 312e12),
    ("NVIDIA A10", "bfloat16", 125e12),
    ("NVIDIA L4", "bfloat16", 121e12),
    ("NVIDIA L40", "bfloat16", 181.05e12),
    ("NVIDIA L40S", "bfloat16", 366.5e12),
    ("Tesla V100-SXM2-32GB", "float16", 125e12),
    ("Tesla T4", "float16", 65e12),
])
def test_known_devices_have_their_datasheet_dense_peak(name, dtype, peak):
    assert peak_flops(name, dtype) == peak


@pytest.mark.parametrize(("name", "dtype"), [
    ("NVIDIA A10G", "bfloat16"),            # not an A10: no NVIDIA datasheet, so no MFU
    ("NVIDIA H100", "bfloat16"),            # which H100? SXM, PCIe and NVL differ
    ("NVIDIA L4 ", "float32"),              # float32: the kernel decides SIMT, TF32 or 3xTF32
    ("NVIDIA H100 80GB HBM3", "float32"),
    ("Tesla V100-SXM2-32GB", "bfloat16"),   # no bf16 tensor cores
    ("NVIDIA GeForce RTX 4090", "bfloat16"),
    ("NVIDIA B200", "bfloat16"),
    ("cpu", "float32"),
])
def test_unknown_devices_and_dtypes_get_no_peak(name, dtype):
    assert peak_flops(name, dtype) is None


def test_no_known_name_is_read_as_another_by_a_shared_prefix():
    assert len({peak_flops(n, "bfloat16") for n in ("NVIDIA L4", "NVIDIA L40", "NVIDIA L40S")}) == 3
    assert peak_flops("NVIDIA L40S", "bfloat16") != peak_flops("NVIDIA L40", "bfloat16")
