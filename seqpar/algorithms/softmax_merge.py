"""The online-softmax merge: the one place its math lives.

Two partial attention results over disjoint key sets, (out1, lse1) and (out2, lse2), combine as
    lse = logaddexp(lse1, lse2);  out = exp(lse1 - lse) * out1 + exp(lse2 - lse) * out2.
`out` is (batch, seq, heads, head_dim); `lse` is (batch, heads, seq). A side whose keys were all
masked carries lse = -inf and contributes nothing; two such sides give lse = -inf and out = 0, not NaN.

`merge_into` is the hot one (every ring step, every block of every task): it works in place on the
accumulators. The only temporaries are (batch, heads, seq) — the new lse and the two weights — so a
step allocates nothing the size of `out` (the old form built a new float32 out and lse per call and
copied them back, and cast a 16-bit partial to float32 first).
"""

from __future__ import annotations

import torch


def _weights(lse_a: torch.Tensor, lse_b: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(lse, w_a, w_b): the merged lse and each side's weight exp(lse_side - lse), (B, H, S). Where
    both sides are -inf the weights are 0 (exp(-inf - 0)), not NaN."""
    lse = torch.logaddexp(lse_a, lse_b)
    safe = lse.nan_to_num(neginf=0.0)  # -inf only where both sides are -inf
    # both weights in two calls, not four (the same subtraction and exp, element by element)
    w_a, w_b = torch._foreach_sub([lse_a, lse_b], [safe, safe])
    torch._foreach_exp_([w_a, w_b])
    return lse, w_a, w_b


def _bshd(w: torch.Tensor) -> torch.Tensor:
    """A (batch, heads, seq) weight as a (batch, seq, heads, 1) view that scales a bshd output."""
    return w.transpose(1, 2).unsqueeze(-1)


def merge(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine two partial results into new tensors; returns (out, lse) in the dtypes of
    (out_a, lse_a)."""
    lse, w_a, w_b = _weights(lse_a, lse_b.to(lse_a.dtype))
    out = out_a * _bshd(w_a).to(out_a.dtype)
    out.addcmul_(out_b, _bshd(w_b).to(out_a.dtype))
    return out, lse


def merge_into(
    acc_out: torch.Tensor, acc_lse: torch.Tensor, out: torch.Tensor, lse: torch.Tensor
) -> None:
    """In-place merge of a partial (out, lse) into the accumulators (acc_out, acc_lse): acc_out is
    scaled in place and the partial added with one fused multiply-add (a 16-bit `out` is read as
    it is and promoted inside the op); acc_lse takes the merged lse. Views (row ranges of larger
    accumulators) are fine."""
    new_lse, w_acc, w_new = _weights(acc_lse, lse.to(acc_lse.dtype))
    acc_out.mul_(_bshd(w_acc)).addcmul_(out, _bshd(w_new))
    acc_lse.copy_(new_lse)


def empty_partial(
    like_q: torch.Tensor, acc_dtype: torch.dtype, lse_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Accumulators of a result that has seen no keys yet: out = 0, lse = -inf."""
    b, s, h, _ = like_q.shape
    out = torch.zeros(like_q.shape, dtype=acc_dtype, device=like_q.device)
    lse = torch.full((b, h, s), float("-inf"), dtype=lse_dtype, device=like_q.device)
    return out, lse
