"""The operations cut from the hot paths (issue 36) compute exactly what the longer forms did, bit
for bit in float64: a first merge into empty accumulators is a copy, the merge's weights by
foreach, finite_lse in one call, RoPE with the sign folded into the sin table."""

from __future__ import annotations

import math

import torch

from seqpar.algorithms import blocks
from seqpar.algorithms.kernels.tensors import finite_lse
from seqpar.algorithms.softmax_merge import merge_into
from seqpar.model.layers import apply_rope, rope_tables


def _partial(g: torch.Generator, s: int = 37) -> tuple[torch.Tensor, torch.Tensor]:
    out = torch.randn(2, s, 3, 8, generator=g, dtype=torch.float64)
    lse = torch.randn(2, 3, s, generator=g, dtype=torch.float64)
    lse[:, :, ::5] = float("-inf")  # rows that saw no key
    out[:, ::5] = 0.0
    return out, lse


def test_first_write_into_empty_accumulators_equals_the_merge():
    g = torch.Generator().manual_seed(0)
    out, lse = _partial(g)
    merged_out, merged_lse = blocks.new_partial(out)
    merge_into(merged_out, merged_lse, out, lse)
    copied_out, copied_lse = blocks.new_partial(out)
    blocks._into(copied_out, copied_lse, out, lse, first=True)
    assert torch.equal(merged_out, copied_out) and torch.equal(merged_lse, copied_lse)


def test_merge_weights_match_the_four_call_form():
    g = torch.Generator().manual_seed(1)
    (a, la), (b, lb) = _partial(g), _partial(g)
    lse = torch.logaddexp(la, lb)
    safe = lse.nan_to_num(neginf=0.0)
    wa, wb = torch.sub(la, safe).exp_(), torch.sub(lb, safe).exp_()
    want = a.mul(wa.transpose(1, 2).unsqueeze(-1)).addcmul_(b, wb.transpose(1, 2).unsqueeze(-1))
    merge_into(a, la, b, lb)
    assert torch.equal(a, want) and torch.equal(la, lse)


def test_seen_copies_only_rows_nothing_has_written():
    seen = blocks.Seen()
    assert seen.first(0, 4) and seen.first(4, 8)
    assert not seen.first(2, 6) and not seen.first(7, 9)
    assert seen.first(9, 12)


def test_finite_lse_is_the_where_form():
    lse = torch.tensor([0.5, -math.inf, math.inf, math.nan, -3.0], dtype=torch.float64)
    want = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    assert torch.equal(finite_lse(lse).nan_to_num(nan=7.0), want.nan_to_num(nan=7.0))
    assert torch.isnan(finite_lse(lse)[3])


def test_rope_matches_rotate_half_forward_and_backward():
    g = torch.Generator().manual_seed(2)
    pos = torch.randperm(64, generator=g)[:20]
    d = 16
    x = torch.randn(2, 20, 3, d, generator=g, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(2, 20, 3, d, generator=g, dtype=torch.float64)
    cos, signed = rope_tables(pos, d, 10000.0, torch.float64)
    apply_rope(x, cos, signed).backward(grad)
    new_out, new_grad = apply_rope(x, cos, signed).detach(), x.grad.clone()
    x.grad = None
    # the textbook form: sin of the duplicated angles, x * cos + cat(-x2, x1) * sin
    inv = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = pos.to(torch.float64)[:, None] * inv[None, :]
    sin = torch.cat([angles, angles], dim=-1).sin()[None, :, None, :]
    old = x * cos + torch.cat([-x[..., d // 2:], x[..., : d // 2]], dim=-1) * sin
    old.backward(grad)
    assert torch.equal(old.detach(), new_out) and torch.equal(x.grad, new_grad)
