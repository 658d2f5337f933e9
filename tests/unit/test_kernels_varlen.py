"""Packed documents on the flash backend: a block's tasks as flash-attn varlen calls, without a GPU.

The stand-in flash-attn 2.8 (flash_stand_in.py) checks every argument as flash-attn's C++ does and
computes real results in float32 on CPU tensors; `flash_unsupported` is patched so that CPU tensors
take the flash path. The per-task path is the same stand-in reporting version 2.5 (whose padded
varlen lse seqpar does not use), so both paths run the same arithmetic and differ only in how the
tasks are called.
"""

from __future__ import annotations

import sys

import flash_stand_in as stand_in
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from seqpar.algorithms import blocks, kernels, layouts, ledger
from seqpar.algorithms.kernels import binding
from seqpar.algorithms.kernels import capability as kernel_capability
from seqpar.algorithms.layouts import Relation, Task

CU = (0, 5, 12, 20, 23, 40)  # five documents of 5, 7, 8, 3 and 17 tokens
N = CU[-1]


def _zigzag(rank):
    return layouts.positions("zigzag", rank, 2, N, CU)


def _stripe(rank):
    return layouts.positions("stripe", rank, 2, N, CU)


# (query positions, key positions, relation) of blocks with several documents
BLOCKS = {
    "diagonal, causal documents": (torch.arange(N), torch.arange(N), Relation(True, CU)),
    "diagonal, documents, window 4": (torch.arange(N), torch.arange(N), Relation(True, CU, 4)),
    "zigzag 0 x 1, causal documents": (_zigzag(0), _zigzag(1), Relation(True, CU)),
    "zigzag 1 x 0, documents, window 6": (_zigzag(1), _zigzag(0), Relation(True, CU, 6)),
    "stripe 1 x 0, documents, window 6": (_stripe(1), _stripe(0), Relation(True, CU, 6)),
    "stripe 0 x 1, one causal document": (_stripe(0), _stripe(1), Relation(True)),
    "diagonal, full documents, window 5": (torch.arange(N), torch.arange(N), Relation(False, CU, 5)),
}


@pytest.fixture
def flash(monkeypatch):
    """The stand-in flash-attn 2.8, taken by CPU tensors; returns its call record."""
    calls = stand_in.install(monkeypatch, "2.8.3")
    monkeypatch.setattr(kernel_capability, "flash_unsupported", lambda *args, **kwargs: None)
    blocks._packing.cache_clear()
    yield calls
    kernels.flash_attn.cache_clear()
    blocks._packing.cache_clear()


def _per_task(monkeypatch):
    """flash-attn 2.5: seqpar calls the kernel once per task."""
    monkeypatch.setattr(sys.modules["flash_attn"], "__version__", "2.5.9")


def _inputs(sq, sk, b=2, h=4, hkv=2, d=12, dtype=torch.float16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, dout = (torch.randn(b, sq, h, d, generator=g).to(dtype) for _ in range(2))
    k, v = (torch.randn(b, sk, hkv, d, generator=g).to(dtype) for _ in range(2))
    return q, k, v, dout


def _reference(q, k, v, dout, q_pos, k_pos, rel):
    """out, lse, dq, dk, dv in float64 with the relation's explicit mask."""
    lo, hi = (torch.as_tensor(x) for x in rel.ranges(q_pos, k_pos))
    j = torch.arange(k.shape[1])
    keep = (j >= lo.unsqueeze(1)) & (j < hi.unsqueeze(1))
    q, k, v = (t.double().requires_grad_() for t in (q, k, v))
    g = q.shape[2] // k.shape[2]
    s = torch.einsum("bqhd,bkhd->bhqk", q, k.repeat_interleave(g, 2)) / q.shape[-1] ** 0.5
    s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - torch.where(torch.isneginf(lse), 0.0, lse).unsqueeze(-1))
    out = torch.einsum("bhqk,bkhd->bqhd", p, v.repeat_interleave(g, 2))
    out.backward(dout.double())
    return out.detach(), lse.detach(), q.grad, k.grad, v.grad


def _run_block(q, k, v, dout, tasks, out, lse):
    """forward_tasks and backward_tasks on one block: (out, lse, dq, dk, dv) accumulated."""
    acc_out, acc_lse = blocks.new_partial(q)
    with ledger.recording() as book:
        blocks.forward_tasks(q, k, v, tasks, acc_out, acc_lse, "flash", None)
        with ledger.phase("backward"):
            dq, dk, dv = (blocks.zeros_acc(t) for t in (q, k, v))
            blocks.backward_tasks(dout, q, k, v, out, lse, tasks, dq, dk, dv, "flash", None)
    return (acc_out, acc_lse, dq, dk, dv), book.flops


def _kernel_calls(calls):
    return [name for name, _ in calls]


def _close(got, want, tol):
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.double(), w.double(), rtol=tol, atol=tol)


# ------------------------------------------------------------------------------------ exactness
@pytest.mark.parametrize("name", BLOCKS)
def test_varlen_path_equals_the_per_task_path_and_the_reference(flash, monkeypatch, name):
    q_pos, k_pos, rel = BLOCKS[name]
    tasks = layouts.block_tasks(q_pos, k_pos, rel)
    q, k, v, dout = _inputs(len(q_pos), len(k_pos))
    ref = _reference(q, k, v, dout, q_pos, k_pos, rel)
    out, lse = ref[0].to(q.dtype), ref[1].float()  # the final (out, lse) the backward is given
    grouped, flops = _run_block(q, k, v, dout, tasks, out, lse)
    groups, singles = blocks.plan(tasks)
    assert _kernel_calls(flash).count("flash_attn_varlen_func") == len(groups)
    _per_task(monkeypatch)
    flash.clear()
    per_task, per_task_flops = _run_block(q, k, v, dout, tasks, out, lse)
    assert "flash_attn_varlen_func" not in _kernel_calls(flash)
    _close(grouped, per_task, 1e-3)
    _close(grouped, ref, 4e-3)
    assert flops == per_task_flops and flops["forward"] > 0  # booked per task either way


def test_a_windowed_block_of_five_documents_is_one_varlen_call_each_way(flash, monkeypatch):
    q_pos, k_pos, rel = BLOCKS["diagonal, documents, window 4"]
    tasks = layouts.block_tasks(q_pos, k_pos, rel)
    assert {t.mask for t in tasks} == {"full", "causal", "band"} and len(tasks) == 9
    q, k, v, dout = _inputs(N, N)
    out, lse = kernels.attend(q, k, v, backend="math")  # any (out, lse) will do here
    _run_block(q, k, v, dout, tasks, out, lse)
    assert _kernel_calls(flash) == ["flash_attn_varlen_func", "_flash_attn_varlen_backward"]
    (fwd,), (bwd,) = stand_in.calls("flash_attn_varlen_func"), stand_in.calls(
        "_flash_attn_varlen_backward")
    assert fwd["window_size"] == (3, 0) and fwd["causal"] is False  # W - 1 keys back, none ahead
    assert fwd["cu_seqlens_q"].tolist() == [0, 4, 5, 9, 12, 16, 20, 23, 27, 40] + [
        40 + c for c in (4, 5, 9, 12, 16, 20, 23, 27, 40)]  # batch 2: the sequences twice
    assert fwd["max_seqlen_q"] == 13 and fwd["max_seqlen_k"] == 16
    assert set(bwd) == set(stand_in.VARLEN_BACKWARD_2_8)  # every parameter bound by name
    _per_task(monkeypatch)
    flash.clear()
    _run_block(q, k, v, dout, tasks, out, lse)
    assert _kernel_calls(flash) == ["flash_attn_func"] * 9 + ["_flash_attn_backward"] * 9


@pytest.mark.parametrize("b", [1, 2])
def test_attend_and_grads_tasks_over_packed_documents_in_one_call(flash, b):
    """The local algorithm's shape: one block, documents on the diagonal: the varlen call's
    output is returned as it is."""
    q_pos, k_pos, rel = BLOCKS["diagonal, causal documents"]
    tasks = layouts.block_tasks(q_pos, k_pos, rel)
    q, k, v, dout = _inputs(N, N, b=b, d=16, dtype=torch.bfloat16)
    ref = _reference(q, k, v, dout, q_pos, k_pos, rel)
    out, lse = blocks.attend_tasks(q, k, v, tasks, "flash", None)
    grads = blocks.grads_tasks(dout, q, k, v, out, lse, tasks, "flash", None)
    assert _kernel_calls(flash) == ["flash_attn_varlen_func", "_flash_attn_varlen_backward"]
    assert out.dtype == q.dtype and lse.dtype == torch.float32 and lse.shape == (b, 4, N)
    _close((out, lse, *grads), ref, 3e-2)  # bfloat16 inputs and output


# ------------------------------------------------------------------------------- call reduction
def test_calls_drop_from_one_per_task_to_one_per_group_over_every_layout():
    """Eight documents spanning 16x at P = 4: every (query, key) block of every layout."""
    lengths = (96, 12, 40, 6, 64, 20, 8, 10)
    cu = (0, *torch.tensor(lengths).cumsum(0).tolist())
    n, world = cu[-1], 4
    for layout in layouts.LAYOUTS:
        for window in (None, 16):
            rel = Relation(True, cu, window)
            tasks = calls = 0
            for qr in range(world):
                for kr in range(world):
                    planned = layouts.layout_tasks(layout, world, n, qr, kr, rel)
                    groups, singles = blocks.plan(planned)
                    tasks += len(planned)
                    calls += len(groups) + len(singles)
                    assert len(groups) + len(singles) <= 4  # up to 13 tasks in a block
            assert calls <= tasks / 2, (layout, window, tasks, calls)  # zigzag: 150 -> 21


# ----------------------------------------------------------------------------------- the plan
def _flash_keep(sq, sk, causal, window):
    return stand_in._keep(sq, sk, causal, *window, sk, "cpu")


def _task_keep(t):
    sq, sk = t.q1 - t.q0, t.k1 - t.k0
    if t.mask == "full":
        return torch.ones(sq, sk, dtype=torch.bool)
    if t.mask in ("causal", "shifted"):
        return torch.ones(sq, sk, dtype=torch.bool).tril(-1 if t.mask == "shifted" else 0)
    return kernels.band_keep(sq, sk, t.band, "cpu")


@pytest.mark.parametrize("layout", layouts.LAYOUTS)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_group_computes_its_tasks_exactly_on_disjoint_query_rows(layout, world):
    n = 53
    cu = (0, 7, 9, 30, 41, n)
    for rel in (Relation(True, cu), Relation(True, cu, 5), Relation(False, cu, 4), Relation(True),
                Relation(True, None, 6)):
        seq_len = n if rel.cu is not None else world * 2 * 7
        for qr in range(world):
            for kr in range(world):
                tasks = layouts.layout_tasks(layout, world, seq_len, qr, kr, rel)
                groups, singles = blocks.plan(tasks)
                assert sorted(map(repr, (*[t for g in groups for t in g.tasks], *singles))) == \
                    sorted(map(repr, tasks))
                for g in groups:
                    rows = [(s[0], s[1]) for s in g.spans]
                    assert all(a[1] <= b[0] for a, b in zip(rows, rows[1:], strict=False))
                    for (q0, q1, k0, k1), t in zip(g.spans, g.tasks, strict=True):
                        got = _flash_keep(q1 - q0, k1 - k0, g.causal, g.window)
                        want = _task_keep(t)
                        if t.mask == "shifted":  # the sequence is the task one row down
                            want = want[1:, :-1]
                        assert torch.equal(got, want), (layout, world, rel, t, g)


def test_tasks_that_share_query_rows_go_to_different_calls():
    full = Task(0, 4, 0, 4, "full")
    tasks = (full, Task(0, 4, 4, 8, "full"), Task(4, 8, 0, 8, "full"))
    groups, singles = blocks.plan(tasks)
    assert [g.spans for g in groups] == [((0, 4, 0, 4), (4, 8, 0, 8))] and singles == (tasks[1],)


def test_one_row_full_and_causal_tasks_fit_one_window_but_not_one_call(flash, monkeypatch):
    """A one-row full task and a one-row causal task of the same row: window (-1, 0) computes both,
    but one call would make that row twice."""
    tasks = (Task(0, 1, 0, 3, "full"), Task(0, 1, 3, 4, "causal"), Task(1, 2, 0, 4, "full"),
             Task(1, 2, 4, 5, "causal"), Task(2, 4, 0, 5, "full"))
    groups, singles = blocks.plan(tasks)
    assert [len(g.spans) for g in groups] == [3, 2] and not singles
    q, k, v, dout = _inputs(4, 5)
    out, lse = kernels.attend(q, k, v, backend="math")
    grouped, _ = _run_block(q, k, v, dout, tasks, out, lse)
    _per_task(monkeypatch)
    per_task, _ = _run_block(q, k, v, dout, tasks, out, lse)
    _close(grouped, per_task, 1e-3)


def test_a_non_square_causal_task_is_refused_as_on_the_per_task_path():
    with pytest.raises(ValueError, match="square"):
        blocks.plan((Task(0, 4, 0, 6, "causal"), Task(4, 8, 6, 10, "full")))


def test_flash_attn_2_5_keeps_one_call_per_task(flash, monkeypatch):
    _per_task(monkeypatch)
    assert not kernels.flash_varlen_supported()
    monkeypatch.setattr(sys.modules["flash_attn"], "__version__", "2.6.3")
    assert kernels.flash_varlen_supported()


def test_the_varlen_backward_without_head_dim_padding_fails(flash, monkeypatch):
    """The padding is load-bearing: take it away and the stand-in refuses the call."""
    monkeypatch.setattr(binding, "pad_head_dim", lambda t: t)
    q_pos, k_pos, rel = BLOCKS["diagonal, causal documents"]
    tasks = layouts.block_tasks(q_pos, k_pos, rel)
    q, k, v, dout = _inputs(N, N)
    out, lse = kernels.attend(q, k, v, backend="math")
    with pytest.raises(AssertionError, match="multiple of 8"):
        blocks.grads_tasks(dout, q, k, v, out, lse, tasks, "flash", None)


# -------------------------------------------------------------------------------- fake CUDA
class _HostCopies(TorchDispatchMode):
    """Records every host-to-device copy."""

    def __init__(self):
        super().__init__()
        self.copies = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if func is torch.ops.aten._to_copy.default and args[0].device.type == "cpu" \
                and result.device.type == "cuda":
            self.copies.append(tuple(args[0].shape))
        return result


def test_on_fake_cuda_the_sequence_boundaries_live_on_the_device_and_are_built_once(flash):
    q_pos, k_pos, rel = BLOCKS["diagonal, documents, window 4"]
    tasks = layouts.block_tasks(q_pos, k_pos, rel)
    b, h, d = 2, 4, 12
    with FakeTensorMode():
        q, dout = (torch.randn(b, N, h, d, dtype=torch.bfloat16, device="cuda") for _ in range(2))
        k, v = (torch.randn(b, N, 2, d, dtype=torch.bfloat16, device="cuda") for _ in range(2))
        lse = torch.randn(b, h, N, device="cuda")

        def step():
            with _HostCopies() as mode:
                out, _ = blocks.attend_tasks(q, k, v, tasks, "flash", None)
                grads = blocks.grads_tasks(dout, q, k, v, out, lse, tasks, "flash", None)
            return out, grads, mode.copies

        out, grads, first = step()
        _, _, second = step()
    assert first and not second  # the plan's tensors came over once, then never again
    assert out.shape == q.shape and [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    fwd, bwd = stand_in.calls("flash_attn_varlen_func")[0], stand_in.calls(
        "_flash_attn_varlen_backward")[0]
    for call in (fwd, bwd):
        for cu in (call["cu_seqlens_q"], call["cu_seqlens_k"]):
            assert cu.dtype == torch.int32 and str(cu.device) == "cuda:0"
    assert bwd["q"].shape == (b * N, h, 16) and bwd["softmax_lse"].shape == (h, b * N)
    assert bwd["dout"].shape[-1] == 16 and bwd["dq"].shape == bwd["q"].shape


def test_band_pairs_in_closed_form_counts_every_visible_pair():
    g = torch.Generator().manual_seed(0)
    for _ in range(300):
        sq, sk = (int(x) for x in torch.randint(1, 25, (2,), generator=g))
        a = int(torch.randint(-30, 30, (1,), generator=g))
        b = a + int(torch.randint(0, 40, (1,), generator=g))
        want = int(kernels.band_keep(sq, sk, (a, b), "cpu").sum())
        assert kernels.band_pairs(sq, sk, (a, b)) == want, (sq, sk, a, b)


def test_the_varlen_backward_binds_the_plain_python_signature_of_flash_attn_2_6(flash):
    """flash-attn 2.6: `_flash_attn_varlen_backward` is a plain function taking window_size=(l, r)."""
    seen = {}

    def _flash_attn_varlen_backward_2_6(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q,
                                        cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                        softmax_scale, causal, window_size, softcap, alibi_slopes,
                                        deterministic, rng_state=None):
        seen.update(locals())
        for t in (dq, dk, dv):
            t.zero_()

    sys.modules["flash_attn.flash_attn_interface"]._flash_attn_varlen_backward = \
        _flash_attn_varlen_backward_2_6
    a = stand_in.varlen_backward_arguments()
    seqs = kernels.Varlen(a["cu_seqlens_q"], a["cu_seqlens_k"], 3, 5)
    q = a["q"][..., :12]
    dq, dk, dv = kernels.flash_varlen_backward(q, q, a["k"][..., :12], a["v"][..., :12], q,
                                               a["softmax_lse"], seqs, False, (2, 0), 0.5)
    assert seen["window_size"] == (2, 0) and seen["max_seqlen_k"] == 5 and seen["softcap"] == 0.0
    assert seen["cu_seqlens_q"] is seqs.cu_q and seen["q"].shape[-1] == 16
    assert dq.shape == (5, 4, 12) and dk.shape == dv.shape == (7, 2, 12)
