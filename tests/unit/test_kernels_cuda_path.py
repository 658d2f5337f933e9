"""The CUDA call paths of the attention kernels, exercised without a GPU.

- torch's memory-efficient kernels have fake (meta) implementations: the 'torch' backend runs on
  fake CUDA tensors (FakeTensorMode), and the arguments that reach the aten backward are held against
  the CUDA kernel's own checks (mem_eff_attention/kernel_backward.h `check_supported`).
- flash-attn cannot be installed here: a stand-in `flash_attn.flash_attn_interface` carries
  `_flash_attn_backward` as flash-attn 2.7/2.8 define it (a `torch.library.custom_op` with 2.8's exact
  parameters) and `flash_attn_func` as 2.8 returns it; the stand-in validates what it is given as
  flash-attn's mha_fwd/mha_bwd do (csrc/flash_attn/flash_api.cpp) and computes the real gradients, so
  a call that binds the wrong arguments, or forgets the head-dim padding, fails here.
"""

import math
import sys
import types
from typing import Optional

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from seqpar.algorithms import kernels
from seqpar.algorithms.kernels import capability as kernel_capability
from seqpar.algorithms.kernels import dispatch, flash
from seqpar.errors import ConfigError

FLASH_CALLS: list[dict] = []  # what the stand-in _flash_attn_backward was given, per call

# flash-attn 2.8's _flash_attn_backward parameters, in order (flash_attn/flash_attn_interface.py)
FLASH_2_8_BACKWARD = [
    "dout", "q", "k", "v", "out", "softmax_lse", "dq", "dk", "dv", "dropout_p", "softmax_scale",
    "causal", "window_size_left", "window_size_right", "softcap", "alibi_slopes", "deterministic",
    "rng_state",
]


def _check_like_mha(q, k, v, out=None, dout=None, lse=None, grads=()):
    """The argument checks of flash-attn 2.8's mha_fwd / mha_bwd that a caller can get wrong."""
    b, sq, h, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    assert q.dtype in (torch.float16, torch.bfloat16), q.dtype
    assert k.dtype == v.dtype == q.dtype
    assert d % 8 == 0, f"head_size should be a multiple of 8, got {d}"
    assert d <= 256 and h % hkv == 0
    assert tuple(k.shape) == (b, sk, hkv, d) and tuple(v.shape) == (b, sk, hkv, d)
    for t in (q, k, v, out, dout, *grads):
        assert t is None or t.stride(-1) == 1, "must have contiguous last dimension"
    if out is not None:
        assert tuple(out.shape) == (b, sq, h, d) and out.dtype == q.dtype
        assert tuple(dout.shape[:3]) == (b, sq, h) and dout.dtype == q.dtype
        assert tuple(lse.shape) == (b, h, sq) and lse.dtype == torch.float32 and lse.is_contiguous()
        dq, dk, dv = grads
        assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape


def _scores(q, k, scale, causal):
    g = q.shape[2] // k.shape[2]
    s = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float().repeat_interleave(g, 2)) * scale
    if causal:
        keep = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool).tril()
        s = s.masked_fill(~keep, float("-inf"))
    return s


def _reduce(t, hkv):
    b, s, h, d = t.shape
    return t.view(b, s, hkv, h // hkv, d).sum(3)


@torch.library.custom_op("seqpar_test_flashattn::_flash_attn_forward", mutates_args=())
def _flash_attn_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float, softmax_scale: float,
    causal: bool, window_size_left: int, window_size_right: int, softcap: float,
    alibi_slopes: Optional[torch.Tensor], return_softmax: bool,  # noqa: UP045 (custom_op schema)
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    _check_like_mha(q, k, v)
    s = _scores(q, k, softmax_scale, causal)
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse.unsqueeze(-1))
    g = q.shape[2] // k.shape[2]
    out = torch.einsum("bhqk,bkhd->bqhd", p, v.float().repeat_interleave(g, 2)).to(q.dtype)
    return out, lse, torch.empty(0, dtype=q.dtype), torch.zeros(2, dtype=torch.int64)


@_flash_attn_forward.register_fake
def _(q, k, v, dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap,
      alibi_slopes, return_softmax):
    _check_like_mha(q, k, v)
    b, sq, h, _ = q.shape
    return (torch.empty_like(q), q.new_empty((b, h, sq), dtype=torch.float32), q.new_empty(0),
            q.new_empty(2, dtype=torch.int64))


@torch.library.custom_op("seqpar_test_flashattn::_flash_attn_backward",
                         mutates_args=("dq", "dk", "dv"))
def _flash_attn_backward(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    softmax_lse: torch.Tensor,
    dq: Optional[torch.Tensor], dk: Optional[torch.Tensor], dv: Optional[torch.Tensor],  # noqa: UP045
    dropout_p: float, softmax_scale: float, causal: bool,
    window_size_left: int, window_size_right: int, softcap: float,
    alibi_slopes: Optional[torch.Tensor], deterministic: bool,  # noqa: UP045
    rng_state: Optional[torch.Tensor] = None,  # noqa: UP045
) -> torch.Tensor:
    FLASH_CALLS.append(dict(locals()))
    _check_like_mha(q, k, v, out, dout, softmax_lse, (dq, dk, dv))
    d = q.shape[-1]
    do = torch.nn.functional.pad(dout.float(), (0, d - dout.shape[-1]))  # mha_bwd pads dout
    g = q.shape[2] // k.shape[2]
    kx, vx = (t.float().repeat_interleave(g, 2) for t in (k, v))
    p = torch.exp(_scores(q, k, softmax_scale, causal) - softmax_lse.unsqueeze(-1))
    dp = torch.einsum("bqhd,bkhd->bhqk", do, vx)
    delta = (do * out.float()).sum(-1).transpose(1, 2).unsqueeze(-1)
    ds = p * (dp - delta) * softmax_scale
    dq.copy_(torch.einsum("bhqk,bkhd->bqhd", ds, kx))
    dk.copy_(_reduce(torch.einsum("bhqk,bqhd->bkhd", ds, q.float()), k.shape[2]))
    dv.copy_(_reduce(torch.einsum("bhqk,bqhd->bkhd", p, do), k.shape[2]))
    b, sq, h, _ = q.shape
    return torch.empty(b, h, -(-sq // 128) * 128)


@_flash_attn_backward.register_fake
def _(dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p, softmax_scale, causal,
      window_size_left, window_size_right, softcap, alibi_slopes, deterministic, rng_state=None):
    FLASH_CALLS.append(dict(locals()))
    _check_like_mha(q, k, v, out, dout, softmax_lse, (dq, dk, dv))
    b, sq, h, _ = q.shape
    return q.new_empty((b, h, -(-sq // 128) * 128), dtype=torch.float32)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash-attn 2.8's flash_attn_func, forward only: pad the head dim, run, slice, and return
    (out, softmax_lse, S_dmask) with return_attn_probs."""
    d = q.shape[-1]
    q, k, v = (torch.nn.functional.pad(t, (0, -d % 8)) for t in (q, k, v))
    out, lse, s_dmask, _ = _flash_attn_forward(
        q, k, v, dropout_p, softmax_scale, causal=causal, window_size_left=window_size[0],
        window_size_right=window_size[1], softcap=softcap, alibi_slopes=alibi_slopes,
        return_softmax=return_attn_probs and dropout_p > 0)
    out = out.narrow(-1, 0, d)
    return (out, lse, s_dmask) if return_attn_probs else out


@pytest.fixture
def fake_flash(monkeypatch):
    """flash-attn 2.8's interface module (the stand-in above) importable as flash_attn."""
    iface = types.ModuleType("flash_attn.flash_attn_interface")
    iface._flash_attn_backward = _flash_attn_backward
    iface._wrapped_flash_attn_backward = torch.ops.seqpar_test_flashattn._flash_attn_backward
    iface.flash_attn_func = flash_attn_func
    package = types.ModuleType("flash_attn")
    package.flash_attn_interface = iface
    monkeypatch.setitem(sys.modules, "flash_attn", package)
    monkeypatch.setitem(sys.modules, "flash_attn.flash_attn_interface", iface)
    kernels.flash_attn.cache_clear()
    FLASH_CALLS.clear()
    yield FLASH_CALLS
    kernels.flash_attn.cache_clear()


@pytest.fixture
def ampere(monkeypatch):
    """Every CUDA device reads as compute capability 8.0 (an A100)."""
    monkeypatch.setattr(kernel_capability, "_capability", lambda device: (8, 0), raising=False)


def _cuda_inputs(b, s, h, hkv, d, dtype):
    q, dout = (torch.randn(b, s, h, d, dtype=dtype, device="cuda") for _ in range(2))
    k, v = (torch.randn(b, s, hkv, d, dtype=dtype, device="cuda") for _ in range(2))
    return q, k, v, dout


# ------------------------------------------------------------------------------------ flash-attn
def test_a_custom_op_hides_its_parameters_from_inspect_but_not_from_op_parameters():
    import inspect

    assert list(inspect.signature(_flash_attn_backward).parameters) == ["args", "kwargs"]
    names, required = kernels.op_parameters(_flash_attn_backward)
    assert list(names) == FLASH_2_8_BACKWARD and required == set(FLASH_2_8_BACKWARD) - {"rng_state"}
    packet = torch.ops.seqpar_test_flashattn._flash_attn_backward
    assert kernels.op_parameters(packet) == (names, required)

    def flash_2_6(dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p, softmax_scale, causal,
                  window_size, softcap, alibi_slopes, deterministic, rng_state=None):
        """flash-attn 2.6's plain-Python _flash_attn_backward (window_size a pair)."""

    names, required = kernels.op_parameters(flash_2_6)
    assert "window_size" in required and "rng_state" in names and "rng_state" not in required


@pytest.mark.parametrize("mask", kernels.MASKS)
@pytest.mark.parametrize("head_dim", [12, 64])
def test_flash_backward_on_fake_cuda_binds_every_argument_of_flash_attn_2_8(
        fake_flash, ampere, mask, head_dim):
    b, s, h, hkv = 2, 10, 4, 2
    with FakeTensorMode():
        q, k, v, dout = _cuda_inputs(b, s, h, hkv, head_dim, torch.bfloat16)
        out, lse = kernels.attend(q, k, v, mask, backend="flash")
        dq, dk, dv = kernels.attend_backward(dout, q, k, v, out, lse, mask, backend="flash")
    assert out.shape == q.shape and lse.shape == (b, h, s) and lse.dtype == torch.float32
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    assert str(dq.device) == "cuda:0"
    padded = -(-head_dim // 8) * 8
    rows = s - 1 if mask == "shifted" else s
    (call,) = fake_flash  # one kernel call per block, every argument bound by name
    assert set(call) == set(FLASH_2_8_BACKWARD)
    assert call["q"].shape == (b, rows, h, padded) and call["k"].shape == (b, rows, hkv, padded)
    assert call["dq"].shape == call["q"].shape and call["dv"].shape == call["v"].shape
    assert call["softmax_lse"].shape == (b, h, rows)
    assert call["causal"] is (mask != "full")
    assert (call["window_size_left"], call["window_size_right"]) == (-1, -1)
    assert call["dropout_p"] == 0.0 and call["softcap"] == 0.0 and call["alibi_slopes"] is None
    assert call["softmax_scale"] == pytest.approx(1 / math.sqrt(head_dim))
    assert call["deterministic"] is False and call["rng_state"] is None


@pytest.mark.parametrize("mask", kernels.MASKS)
def test_flash_path_gradients_equal_the_math_kernel_with_a_padded_head_dim(fake_flash, mask):
    # the CPU impl of the stand-in computes what flash-attn would: grads must come back sliced
    torch.manual_seed(0)
    q, dout = (torch.randn(1, 9, 4, 12, dtype=torch.float16) for _ in range(2))
    k, v = (torch.randn(1, 9, 2, 12, dtype=torch.float16) for _ in range(2))
    out, lse = dispatch._forward(q, k, v, mask, "flash-attn", 12 ** -0.5)
    got = dispatch._backward(dout, q, k, v, out, lse, mask, "flash-attn", 12 ** -0.5)
    want_out, want_lse = dispatch._forward(q, k, v, mask, "math", 12 ** -0.5)
    want = dispatch._backward(dout, q, k, v, want_out, want_lse, mask, "math", 12 ** -0.5)
    torch.testing.assert_close(out, want_out, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(lse, want_lse, rtol=1e-5, atol=1e-5)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=2e-3, atol=2e-3)


def test_flash_refuses_a_causal_block_that_is_not_square(fake_flash):
    q, k = torch.randn(1, 4, 2, 8, dtype=torch.float16), torch.randn(1, 6, 2, 8, dtype=torch.float16)
    with pytest.raises(ValueError, match="square"):
        flash.flash_forward(q, k, k, True, 1.0)


# ----------------------------------------------------------------- torch's memory-efficient kernel
class _Recorder(TorchDispatchMode):
    """Records the arguments of the aten ops named in `ops`."""

    def __init__(self, *ops):
        super().__init__()
        self.ops, self.calls = ops, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if func in self.ops:
            self.calls.append((func, args, result))
        return result


def _check_like_efficient_backward(args, forward_lse_shape):
    """mem_eff_attention/kernel_backward.h check_supported on the logsumexp argument."""
    query, lse = args[1], args[6]
    b, h = query.shape[0], query.shape[1]
    assert lse.dtype == torch.float32 and lse.dim() == 3
    assert h <= 1 or lse.stride(1) % 8 == 0, f"LSE is not correctly aligned (strideH {lse.stride(1)})"
    assert b <= 1 or lse.stride(0) % 8 == 0, f"LSE is not correctly aligned (strideB {lse.stride(0)})"
    assert tuple(lse.shape) == forward_lse_shape  # the layout the forward hands its backward


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mask", kernels.MASKS)
@pytest.mark.parametrize("s", [10, 33])
def test_efficient_backward_on_fake_cuda_gets_an_lse_aligned_as_the_kernel_requires(
        ampere, dtype, mask, s):
    aten = torch.ops.aten
    fwd, bwd = (aten._scaled_dot_product_efficient_attention.default,
                aten._scaled_dot_product_efficient_attention_backward.default)
    b, h, hkv, d = 2, 4, 2, 16
    with FakeTensorMode(), _Recorder(fwd, bwd) as rec:
        q, k, v, dout = _cuda_inputs(b, s, h, hkv, d, dtype)
        out, lse = kernels.attend(q, k, v, mask, backend="torch")
        merged_lse = torch.randn(b, h, s, device="cuda")  # as a ring's merge hands it back
        dq, dk, dv = kernels.attend_backward(dout, q, k, v, out, merged_lse, mask, backend="torch")
    assert out.shape == q.shape and lse.shape == (b, h, s) and lse.dtype == torch.float32
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    (_, _, forward), (_, args, _) = rec.calls
    _check_like_efficient_backward(args, tuple(forward[1].shape))


def test_efficient_lse_pads_the_sequence_to_32_and_keeps_the_values():
    lse = torch.randn(2, 3, 9)
    padded = kernels.efficient_lse(lse)
    assert padded.shape == (2, 3, 32) and padded.stride() == (96, 32, 1)
    assert torch.equal(padded[..., :9], lse)


# ------------------------------------------------------------------------------------ auto backend
@pytest.mark.parametrize(("capability", "dtype", "head_dim", "want"), [
    ((8, 0), torch.bfloat16, 128, "flash"),    # A100
    ((8, 6), torch.float16, 64, "flash"),      # A10 / RTX 30
    ((8, 9), torch.bfloat16, 256, "flash"),    # L4 / L40S
    ((9, 0), torch.bfloat16, 64, "flash"),     # H100
    ((9, 0), torch.bfloat16, 320, "torch"),    # head dim over flash-attn 2's 256
    ((10, 0), torch.bfloat16, 64, "torch"),    # B200: flash-attn 2 checks sm8x or sm90
    ((7, 5), torch.float16, 64, "torch"),      # T4
    ((7, 0), torch.bfloat16, 64, "math"),      # V100: no bf16 memory-efficient kernel
    ((8, 0), torch.float32, 64, "torch"),
    ((8, 0), torch.float64, 64, "math"),
])
def test_auto_takes_flash_only_where_flash_attn_2_runs(fake_flash, monkeypatch, capability, dtype,
                                                       head_dim, want):
    monkeypatch.setattr(kernel_capability, "_capability", lambda device: capability)
    got = kernels.resolve_backend("auto", torch.device("cuda", 0), dtype, head_dim=head_dim)
    assert got == want


@pytest.mark.parametrize(("capability", "dtype", "head_dim", "why"), [
    ((7, 5), torch.float16, 64, "compute capability 8.x or 9.0"),
    ((12, 0), torch.bfloat16, 64, "sm_120"),
    ((8, 0), torch.bfloat16, 512, "head_dim <= 256"),
    ((8, 0), torch.float32, 64, "float16/bfloat16"),
])
def test_flash_requested_where_it_cannot_run_is_a_one_line_config_error(
        fake_flash, monkeypatch, capability, dtype, head_dim, why):
    monkeypatch.setattr(kernel_capability, "_capability", lambda device: capability)
    with pytest.raises(ConfigError, match=why) as err:
        kernels.resolve_backend("flash", torch.device("cuda", 0), dtype, head_dim=head_dim)
    assert str(err.value).startswith("backend='flash': ") and "\n" not in str(err.value)


def test_flash_without_the_package_or_off_cuda_says_so(ampere, monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # import fails
    kernels.flash_attn.cache_clear()
    try:
        with pytest.raises(ConfigError, match="flash-attn package"):
            kernels.resolve_backend("flash", torch.device("cuda", 0), torch.bfloat16, head_dim=64)
        assert kernels.resolve_backend("auto", torch.device("cuda", 0), torch.bfloat16) == "torch"
    finally:
        kernels.flash_attn.cache_clear()
    with pytest.raises(ConfigError, match="needs a CUDA device"):
        kernels.resolve_backend("flash", torch.device("cpu"), torch.bfloat16)


def test_torch_backend_refuses_bf16_before_ampere(monkeypatch):
    monkeypatch.setattr(kernel_capability, "_capability", lambda device: (7, 0))
    with pytest.raises(ConfigError, match="bfloat16"):
        kernels.resolve_backend("torch", torch.device("cuda", 0), torch.bfloat16)
    assert kernels.resolve_backend("torch", torch.device("cuda", 0), torch.float16) == "torch"


def test_flash_backward_binds_the_older_plain_python_signature_with_a_window_pair(monkeypatch):
    """flash-attn 2.5/2.6: `_flash_attn_backward` is a plain function taking window_size=(l, r)."""
    seen = {}

    def _flash_attn_backward_2_6(dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p,
                                 softmax_scale, causal, window_size, softcap, alibi_slopes,
                                 deterministic, rng_state=None):
        seen.update(locals())
        for t in (dq, dk, dv):
            t.zero_()

    iface = types.ModuleType("flash_attn.flash_attn_interface")
    iface._flash_attn_backward = _flash_attn_backward_2_6
    monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
    monkeypatch.setitem(sys.modules, "flash_attn.flash_attn_interface", iface)
    kernels.flash_attn.cache_clear()
    try:
        q = torch.randn(1, 4, 2, 12, dtype=torch.float16)
        lse = torch.randn(1, 2, 4)
        dq, dk, dv = flash.flash_backward(q, q, q, q, q, lse, True, 0.5)
    finally:
        kernels.flash_attn.cache_clear()
    assert seen["window_size"] == (-1, -1) and seen["rng_state"] is None
    assert seen["q"].shape[-1] == 16 and dq.shape == (1, 4, 2, 12)
