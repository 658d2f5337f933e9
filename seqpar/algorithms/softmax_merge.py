"""The online-softmax merge: the one place its math lives.

Two partial attention results over disjoint key sets, (out1, lse1) and (out2, lse2), combine as
    lse = logaddexp(lse1, lse2);  out = exp(lse1 - lse) * out1 + exp(lse2 - lse) * out2.
`out` is (batch, seq, heads, head_dim); `lse` is (batch, heads, seq). A side whose keys were all
masked carries lse = -inf and contributes nothing; two such sides give lse = -inf and out = 0, not NaN.
"""

from __future__ import annotations

import torch


def _weights(lse_a: torch.Tensor, lse_b: torch.Tensor) -> tuple[torch.Tensor, ...]:
    lse = torch.logaddexp(lse_a, lse_b)
    safe = torch.where(torch.isinf(lse) & (lse < 0), torch.zeros_like(lse), lse)
    w_a = torch.exp(lse_a - safe)
    w_b = torch.exp(lse_b - safe)
    # (batch, heads, seq) -> (batch, seq, heads, 1) to scale bshd outputs
    return lse, w_a.transpose(1, 2).unsqueeze(-1), w_b.transpose(1, 2).unsqueeze(-1)


def merge(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine two partial results; returns (out, lse) in the dtypes of (out_a, lse_a)."""
    lse, w_a, w_b = _weights(lse_a, lse_b)
    out = w_a.to(out_a.dtype) * out_a + w_b.to(out_b.dtype) * out_b
    return out, lse


def merge_into(
    acc_out: torch.Tensor, acc_lse: torch.Tensor, out: torch.Tensor, lse: torch.Tensor
) -> None:
    """In-place merge of a partial (out, lse) into accumulators (acc_out, acc_lse)."""
    new_out, new_lse = merge(acc_out, acc_lse, out.to(acc_out.dtype), lse.to(acc_lse.dtype))
    acc_out.copy_(new_out)
    acc_lse.copy_(new_lse)


def empty_partial(
    like_q: torch.Tensor, acc_dtype: torch.dtype, lse_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Accumulators of a result that has seen no keys yet: out = 0, lse = -inf."""
    b, s, h, _ = like_q.shape
    out = torch.zeros(like_q.shape, dtype=acc_dtype, device=like_q.device)
    lse = torch.full((b, h, s), float("-inf"), dtype=lse_dtype, device=like_q.device)
    return out, lse
