from __future__ import annotations

import pytest
import torch

from seqpar.algorithms import kernels, ledger
from seqpar.algorithms.kernels import bands
from seqpar.algorithms.softmax_merge import merge


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
