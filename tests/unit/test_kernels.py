from __future__ import annotations

import pytest
import torch

from seqpar.algorithms import kernels, ledger
from seqpar.algorithms.kernels import bands
from seqpar.algorithms.softmax_merge import merge, merge_into
from seqpar.model.memory import AllocationMeter


def _reference(q, k, v, dout, mask):
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    g = q.shape[2] // k.shape[2]
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k.repeat_interleave(g, 2)) / q.shape[-1] ** 0.5
    n = q.shape[1]
    keep = {"full": torch.ones(n, n), "causal": torch.ones(n, n).tril(),
            "shifted": torch.ones(n, n).tril(-1)}[mask].bool()
    p = torch.softmax(scores.masked_fill(~keep, float("-inf")), -1).nan_to_num(0.0)
    out = torch.einsum("bhqk,bkhd->bqhd", p, v.repeat_interleave(g, 2))
    out.backward(dout)
    return out.detach(), q.grad, k.grad, v.grad


@pytest.mark.parametrize("backend", ["torch", "math"])
@pytest.mark.parametrize("mask", kernels.MASKS)
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_kernel_forward_and_backward_match_reference(backend, mask, kv_heads):
    q = torch.randn(2, 9, 4, 8, dtype=torch.float64)
    k, v = torch.randn(2, 2, 9, kv_heads, 8, dtype=torch.float64).unbind(0)
    dout = torch.randn_like(q)
    out, lse = kernels.attend(q, k, v, mask, backend=backend)
    grads = kernels.attend_backward(dout, q, k, v, out, lse, mask, backend=backend)
    for got, want in zip((out, *grads), _reference(q, k, v, dout, mask), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert lse.dtype == torch.float64 and lse.shape == (2, 4, 9)


def test_shifted_first_row_sees_nothing_and_gives_minus_inf_without_nan():
    q, k, v = torch.randn(3, 1, 5, 2, 4).unbind(0)
    out, lse = kernels.attend(q, k, v, "shifted", backend="torch")
    assert torch.isneginf(lse[:, :, 0]).all() and not torch.isnan(out).any()
    assert (out[:, 0] == 0).all()


def test_merge_of_two_halves_equals_attention_over_all_keys():
    q, k, v = torch.randn(3, 2, 10, 2, 4, dtype=torch.float64).unbind(0)
    full, lse_full = kernels.attend(q, k, v, "full", backend="math")
    a = kernels.attend(q, k[:, :4], v[:, :4], "full", backend="math")
    b = kernels.attend(q, k[:, 4:], v[:, 4:], "full", backend="math")
    out, lse = merge(*a, *b)
    torch.testing.assert_close(out, full, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, lse_full, rtol=1e-12, atol=1e-12)


def test_merge_with_an_empty_side_is_the_other_side_and_two_empty_sides_are_zero():
    out = torch.randn(1, 3, 2, 4)
    lse = torch.randn(1, 2, 3)
    empty_out, empty_lse = torch.zeros_like(out), torch.full_like(lse, float("-inf"))
    merged, merged_lse = merge(empty_out, empty_lse, out, lse)
    torch.testing.assert_close(merged, out)
    both, both_lse = merge(empty_out, empty_lse, empty_out, empty_lse)
    assert not torch.isnan(both).any() and (both == 0).all() and torch.isneginf(both_lse).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_merge_into_merges_in_place_and_allocates_nothing_the_size_of_out(dtype):
    b, s, h, d = 2, 512, 4, 32
    acc_out, part = torch.randn(b, 2 * s, h, d), torch.randn(b, s, h, d).to(dtype)
    acc_lse, part_lse = torch.randn(b, h, 2 * s), torch.randn(b, h, s)
    part_lse[0, 1, :7] = acc_lse[0, 1, s:s + 7] = float("-inf")  # rows no key has reached yet
    want_out, want_lse = merge(acc_out[:, s:], acc_lse[:, :, s:], part.float(), part_lse)
    before = acc_out.clone()
    rows_out, rows_lse = acc_out.narrow(1, s, s), acc_lse.narrow(2, s, s)  # views, as blocks pass
    with AllocationMeter() as mem:
        merge_into(rows_out, rows_lse, part, part_lse)
    torch.testing.assert_close(acc_out[:, s:], want_out, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(acc_lse[:, :, s:], want_lse)
    assert torch.equal(acc_out[:, :s], before[:, :s])  # only its rows
    assert not acc_out.isnan().any() and (acc_out[0, s:s + 7, 1] == 0).all()
    # temporaries of (B, H, S) only, no new out (a 16-bit partial: the float32 copy of it that
    # the CPU's mixed-dtype ops make; CUDA's cast inside the kernel)
    promoted = part.float().nbytes if dtype != torch.float32 else 0
    assert mem.peak < promoted + acc_out[:, s:].nbytes / 4


def test_kernels_book_flops_by_the_papers_convention():
    q = k = v = torch.randn(1, 8, 2, 4)
    with ledger.recording() as book:
        out, lse = kernels.attend(q, k, v, "causal", backend="math")
        with ledger.phase("backward"):
            kernels.attend_backward(torch.ones_like(out), q, k, v, out, lse, "causal",
                                    backend="math")
    assert book.flops["forward"] == 4 * 8 * 8 * 2 * 4 / 2
    assert book.flops["backward"] == 2.5 * book.flops["forward"]


@pytest.mark.parametrize("backend", ["torch", "math"])
@pytest.mark.parametrize("band", [(-7, 1), (-150, 1), (-40, 25), (300, 400)])
def test_a_narrow_band_runs_as_row_tiles_that_equal_the_masked_rectangle(backend, band,
                                                                          monkeypatch):
    """Tiles see only their keys (fewer pairs than the rectangle) and give the masked rectangle's
    out, lse and gradients; rows that see no key stay -inf and 0."""
    monkeypatch.setattr(bands, "BAND_TILE", 64)
    sq, sk = 600, 700
    tiles = kernels.band_tiles(sq, sk, band)
    assert len(tiles) > 1
    assert sum((r1 - r0) * max(c1 - c0, 0) for r0, r1, c0, c1, _ in tiles) < sq * sk / 2
    q = torch.randn(1, sq, 2, 4, dtype=torch.float64)
    k, v = torch.randn(2, 1, sk, 1, 4, dtype=torch.float64).unbind(0)
    dout = torch.randn_like(q)
    got = kernels.attend(q, k, v, "band", backend=backend, band=band)
    got_grads = kernels.attend_backward(dout, q, k, v, *got, "band", backend=backend, band=band)
    monkeypatch.setattr(bands, "BAND_TILE", 10**6)  # one dense call under the explicit mask
    assert len(kernels.band_tiles(sq, sk, band)) == 1
    want = kernels.attend(q, k, v, "band", backend="math", band=band)
    want_grads = kernels.attend_backward(dout, q, k, v, *want, "band", backend="math", band=band)
    for g, w in zip((*got, *got_grads), (*want, *want_grads), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)
