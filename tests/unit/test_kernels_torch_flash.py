"""torch's own CUDA attention kernels under seqpar's blocks, without a GPU.

- torch's FlashAttention-2 (`aten._flash_attention_forward` / `_backward`): a CPU implementation of
  the two aten ops is registered for these tests (`torch.library`), built on the flash-attn
  stand-in (flash_stand_in.py: flash-attn's argument checks, then the real result in float32 with
  its masks, windows and packed sequences), and `torch_flash_unsupported` is patched so that CPU
  tensors take torch's flash path. Dense blocks, bands through a window, GQA without expanding K,V
  and a block's documents as packed (varlen) calls are held against the math kernel.
- On fake CUDA tensors (FakeTensorMode; torch has meta kernels for these ops, cuDNN's included) the
  'auto', 'torch' and 'cudnn' backends reach the kernels the machine would run, with K,V's own head
  count where the kernel takes it.
- `kernel_name` names every kernel; an installed flash-attn that does not import says why, once.
"""

from __future__ import annotations

import logging
import sys
import types

import flash_stand_in as stand_in
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from seqpar.algorithms import blocks, kernels, layouts
from seqpar.algorithms.kernels import capability
from seqpar.algorithms.layouts import Relation
from seqpar.errors import ConfigError

ATEN = torch.ops.aten
SEEN: list[tuple[str, tuple]] = []  # (op, shapes of q, k) of every call of the CPU stand-in


def _side(w):
    return -1 if w is None else w


def _flash_forward_cpu(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p, causal, debug, *, scale=None,
                       window_size_left=None, window_size_right=None, seqused_k=None,
                       alibi_slopes=None, block_table=None, num_splits=None):
    SEEN.append(("forward", tuple(q.shape), tuple(k.shape)))
    left, right = _side(window_size_left), _side(window_size_right)
    if cu_q is None:
        out, lse, _, rng = torch.ops.seqpar_test_standin._flash_attn_forward(
            q, k, v, dropout_p, scale, causal, left, right, 0.0, None, False)
    else:
        out, lse, _, rng = torch.ops.seqpar_test_standin._flash_attn_varlen_forward(
            q, k, v, cu_q, cu_k, max_q, max_k, dropout_p, scale, causal, left, right)
    return out, lse, rng, torch.empty(()), torch.empty(0)


def _flash_backward_cpu(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, dropout_p, causal,
                        seed, offset, *, scale=None, window_size_left=None, window_size_right=None):
    SEEN.append(("backward", tuple(q.shape), tuple(k.shape)))
    left, right = _side(window_size_left), _side(window_size_right)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if cu_q is None:
        torch.ops.seqpar_test_standin._flash_attn_backward(
            dout, q, k, v, out, lse, dq, dk, dv, dropout_p, scale, causal, left, right, 0.0, None,
            False)
    else:
        torch.ops.seqpar_test_standin._flash_attn_varlen_backward(
            dout, q, k, v, out, lse, dq, dk, dv, cu_q, cu_k, max_q, max_k, dropout_p, scale, causal,
            left, right, 0.0, None, False)
    return dq, dk, dv


@pytest.fixture
def torch_flash(monkeypatch):
    """torch's flash ops runnable on the CPU (the stand-in), and taken by CPU tensors."""
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("_flash_attention_forward", _flash_forward_cpu, "CPU")
    lib.impl("_flash_attention_backward", _flash_backward_cpu, "CPU")
    monkeypatch.setattr(capability, "torch_flash_unsupported", lambda *a, **k: None)
    blocks._packing.cache_clear()
    SEEN.clear()
    yield SEEN
    lib._destroy()
    blocks._packing.cache_clear()


def _inputs(sq, sk, b=2, h=4, hkv=2, d=12, dtype=torch.float16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, dout = (torch.randn(b, sq, h, d, generator=g).to(dtype) for _ in range(2))
    k, v = (torch.randn(b, sk, hkv, d, generator=g).to(dtype) for _ in range(2))
    return q, k, v, dout


def _close(got, want, tol=3e-3):
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        torch.testing.assert_close(g.float(), w.float(), rtol=tol, atol=tol)


# ---------------------------------------------------------------------- torch's flash, real values
@pytest.mark.parametrize("mask", ["full", "causal", "shifted", "band"])
@pytest.mark.parametrize("head_dim", [12, 64])
def test_torch_flash_blocks_equal_the_math_kernel_with_gqa_unexpanded(torch_flash, mask, head_dim):
    q, k, v, dout = _inputs(9, 9, d=head_dim, seed=head_dim)
    band = (-3, 2) if mask == "band" else None
    assert kernels.kernel_of("torch", q.device, q.dtype, head_dim=head_dim) == "torch-flash"
    out, lse = kernels.attend(q, k, v, mask, backend="torch", band=band)
    grads = kernels.attend_backward(dout, q, k, v, out, lse, mask, backend="torch", band=band)
    want_out, want_lse = kernels.attend(q, k, v, mask, backend="math", band=band)
    want = kernels.attend_backward(dout, q, k, v, want_out, want_lse, mask, backend="math", band=band)
    _close((out, lse), (want_out, want_lse))
    _close(grads, want)
    assert torch_flash and all(shape_k[-2] == 2 for _, _, shape_k in torch_flash)  # K,V: 2 heads
    assert all(shape_q[-1] % 8 == 0 for _, shape_q, _ in torch_flash)  # the head dim padded


def _zigzag(rank, cu):
    return layouts.positions("zigzag", rank, 2, cu[-1], cu)


@pytest.mark.parametrize("relation", [Relation(True, (0, 5, 12, 20, 23, 40)),
                                      Relation(True, (0, 5, 12, 20, 23, 40), 6)])
def test_a_blocks_documents_run_as_packed_calls_of_torch_flash(torch_flash, relation):
    cu = relation.cu
    qpos, kpos = _zigzag(1, cu), _zigzag(0, cu)
    tasks = layouts.block_tasks(qpos, kpos, relation)
    q, k, v, dout = _inputs(len(qpos), len(kpos), seed=len(tasks))
    out, lse = blocks.attend_tasks(q, k, v, tasks, "torch", None)
    grads = blocks.grads_tasks(dout, q, k, v, out, lse, tasks, "torch", None)
    calls = len(torch_flash)
    want_out, want_lse = blocks.attend_tasks(q, k, v, tasks, "math", None)
    want = blocks.grads_tasks(dout, q, k, v, want_out, want_lse, tasks, "math", None)
    _close((out, lse), (want_out, want_lse))
    _close(grads, want)
    groups, singles = blocks.plan(tuple(tasks))
    assert groups and calls == 2 * (len(groups) + len(singles)) < 2 * len(tasks)
    assert any(len(shape_q) == 3 for _, shape_q, _ in torch_flash)  # varlen: (T, H, D)


# ------------------------------------------------------------------------------- fake CUDA tensors
class _Ops(TorchDispatchMode):
    """Records every aten op an attention call reaches, with its arguments."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append((func, args))
        return func(*args, **(kwargs or {}))

    def of(self, op):
        """The arguments of every call of `op` (an op packet: any of its overloads)."""
        return [args for func, args in self.calls if func.overloadpacket is op]


@pytest.fixture
def cuda_machine(monkeypatch):
    """An sm90 device whose torch has its flash kernel and cuDNN 9, and no flash-attn."""
    monkeypatch.setattr(capability, "_capability", lambda device: (9, 0))
    monkeypatch.setattr(capability, "_torch_flash_built", lambda: True)
    monkeypatch.setattr(capability, "_cudnn_version", lambda: 90100)
    monkeypatch.setitem(sys.modules, "flash_attn", None)
    kernels.flash_attn.cache_clear()
    yield
    kernels.flash_attn.cache_clear()


def _fake_cuda(b=2, s=16, h=8, hkv=2, d=64, dtype=torch.bfloat16):
    q, dout = (torch.randn(b, s, h, d, dtype=dtype, device="cuda") for _ in range(2))
    k, v = (torch.randn(b, s, hkv, d, dtype=dtype, device="cuda") for _ in range(2))
    return q, k, v, dout


@pytest.mark.parametrize("mask", ["full", "causal", "shifted", "band"])
def test_auto_without_flash_attn_runs_torchs_flash_kernel_on_fake_cuda(cuda_machine, mask):
    band = (-5, 1) if mask == "band" else None
    with FakeTensorMode(), _Ops() as ops:
        q, k, v, dout = _fake_cuda(d=68)
        out, lse = kernels.attend(q, k, v, mask, band=band)
        dq, dk, dv = kernels.attend_backward(dout, q, k, v, out, lse, mask, band=band)
    assert out.shape == q.shape and lse.shape == (2, 8, 16) and lse.dtype == torch.float32
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    (fwd,) = ops.of(ATEN._flash_attention_forward)
    (bwd,) = ops.of(ATEN._flash_attention_backward)
    rows = 15 if mask == "shifted" else 16
    assert fwd[0].shape == (2, rows, 8, 72) and fwd[1].shape == (2, rows, 2, 72)  # GQA, padded
    assert bwd[5].shape == (2, 8, rows) and bwd[5].is_contiguous()  # the lse the forward gave
    assert not ops.of(ATEN.repeat_interleave)  # K,V never expanded
    assert not ops.of(ATEN._scaled_dot_product_efficient_attention)


def test_cudnn_backend_runs_dense_blocks_on_cudnn_and_bands_on_torchs_flash(cuda_machine):
    with FakeTensorMode(), _Ops() as ops:
        q, k, v, dout = _fake_cuda()
        out, lse = kernels.attend(q, k, v, "causal", backend="cudnn")
        grads = kernels.attend_backward(dout, q, k, v, out, lse, "causal", backend="cudnn")
        band_out, _ = kernels.attend(q, k, v, "band", backend="cudnn", band=(-3, 1))
    assert out.shape == q.shape and lse.shape == (2, 8, 16)
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    (fwd,) = ops.of(ATEN._scaled_dot_product_cudnn_attention)
    (bwd,) = ops.of(ATEN._scaled_dot_product_cudnn_attention_backward)
    assert fwd[0].shape == (2, 8, 16, 64) and fwd[6] is True  # bhsd views, causal
    assert bwd[5].shape == (2, 8, 16)
    assert band_out.shape == q.shape and len(ops.of(ATEN._flash_attention_forward)) == 1


def test_fp32_on_cuda_takes_the_memory_efficient_kernel(cuda_machine):
    with FakeTensorMode(), _Ops() as ops:
        q, k, v, _ = _fake_cuda(dtype=torch.float32)
        kernels.attend(q, k, v, "causal")
    assert len(ops.of(ATEN._scaled_dot_product_efficient_attention)) == 1


@pytest.mark.parametrize(("capability_", "dtype", "backend", "head_dim", "want"), [
    ((9, 0), torch.bfloat16, "auto", 128, "torch-flash"),
    ((8, 0), torch.float16, "torch", 72, "torch-flash"),
    ((9, 0), torch.bfloat16, "torch", 320, "torch-efficient"),   # over 256: not the flash kernel
    ((7, 5), torch.float16, "auto", 64, "torch-efficient"),      # T4: no flash kernel
    ((9, 0), torch.float32, "auto", 64, "torch-efficient"),
    ((9, 0), torch.bfloat16, "cudnn", 128, "torch-cudnn"),
    ((9, 0), torch.float64, "auto", 64, "math"),
])
def test_kernel_name_names_the_cuda_kernel_a_call_runs(cuda_machine, monkeypatch, capability_,
                                                       dtype, backend, head_dim, want):
    monkeypatch.setattr(capability, "_capability", lambda device: capability_)
    got = kernels.kernel_name(backend, torch.device("cuda", 0), dtype, head_dim=head_dim)
    assert got == want


def test_kernel_name_on_the_cpu_and_with_flash_attn(monkeypatch):
    assert kernels.kernel_name("auto", torch.device("cpu"), torch.float32) == "torch-cpu-flash"
    assert kernels.kernel_name("math", torch.device("cpu"), torch.float32) == "math"
    stand_in.install(monkeypatch, "2.8.3")
    monkeypatch.setattr(capability, "_capability", lambda device: (8, 0))
    try:
        got = kernels.kernel_name("auto", torch.device("cuda", 0), torch.bfloat16, head_dim=128)
    finally:
        kernels.flash_attn.cache_clear()
    assert got == "flash-attn 2.8.3"


@pytest.mark.parametrize(("version", "head_dim", "why"), [
    (80000, 64, "cuDNN 9"), (90100, 256, "head_dim <= 128"), (90100, 68, "multiple of 8")])
def test_cudnn_where_it_cannot_run_is_a_one_line_config_error(cuda_machine, monkeypatch, version,
                                                              head_dim, why):
    monkeypatch.setattr(capability, "_cudnn_version", lambda: version)
    with pytest.raises(ConfigError, match=why) as err:
        kernels.resolve_backend("cudnn", torch.device("cuda", 0), torch.bfloat16, head_dim=head_dim)
    assert "\n" not in str(err.value)


# ------------------------------------------------------------------------ a flash-attn that breaks
def test_a_flash_attn_that_fails_to_import_says_why_once(monkeypatch, caplog):
    class Broken(types.ModuleType):
        def __getattr__(self, name):
            raise ImportError("flash_attn_2_cuda: undefined symbol: _ZN3c104cuda9SetDevice")

    class Finder:
        @staticmethod
        def find_spec(name, path=None, target=None):
            if name.startswith("flash_attn"):
                raise ImportError("flash_attn_2_cuda.so: undefined symbol: _ZN3c104cuda9SetDevice")
            return None

    monkeypatch.delitem(sys.modules, "flash_attn", raising=False)
    monkeypatch.delitem(sys.modules, "flash_attn.flash_attn_interface", raising=False)
    monkeypatch.setattr(sys, "meta_path", [Finder, *sys.meta_path])
    monkeypatch.setattr(capability, "_import_error", [])
    monkeypatch.setattr(capability, "_capability", lambda device: (9, 0))
    kernels.flash_attn.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="seqpar.kernels"):
            for _ in range(3):
                why = kernels.flash_unsupported(torch.device("cuda", 0), torch.bfloat16, 128)
                chosen = kernels.resolve_backend("auto", torch.device("cuda", 0), torch.bfloat16)
    finally:
        kernels.flash_attn.cache_clear()
    assert "installed but does not import" in why and "undefined symbol" in why
    assert chosen == "torch"
    said = [r for r in caplog.records if "flash-attn" in r.getMessage()]
    assert len(said) == 1 and "undefined symbol" in said[0].getMessage()
