"""The online-softmax merge: the one place its math lives.

Two partial attention results over disjoint key sets, (out1, lse1) and (out2, lse2), combine as
    lse = logaddexp(lse1, lse2);  out = exp(lse1 - lse) * out1 + exp(lse2 - lse) * out2.
`out` is (batch, seq, heads, v_head_dim); `lse` is (batch, heads, seq). A side whose keys were all
masked carries lse = -inf and contributes nothing; two such sides give lse = -inf and out = 0, not NaN.

`merge_into` is the hot one (every ring step, every block of every task): it works in place on the
accumulators. The only temporaries are (batch, heads, seq) — the new lse and the two weights — so a
step allocates nothing the size of `out` (the old form built a new float32 out and lse per call and
copied them back, and cast a 16-bit partial to float32 first).

Attention sinks (gpt-oss: a learned logit per query head in every query's softmax denominator, its
column dropped) join once, after the last merge, where a query's lse over every key is final:
`add_sink` scales out by g = exp(lse) / (exp(lse) + exp(sink)) = sigmoid(lse - sink), lse left
as it is; `sink_backward` turns the upstream gradient into the one the attention's own backward
takes (g * dO, with the scaled out as its O: exactly the sink's softmax backward) and gives
dsink = -sum_i (dO_i . O'_i)(1 - g_i) over the queries at hand.
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
    like_q: torch.Tensor, acc_dtype: torch.dtype, lse_dtype: torch.dtype, width: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Accumulators of a result that has seen no keys yet: out = 0 (`width` wide: V's head dim;
    None: like_q's), lse = -inf."""
    b, s, h, d = like_q.shape
    out = torch.zeros((b, s, h, d if width is None else width), dtype=acc_dtype,
                      device=like_q.device)
    lse = torch.full((b, h, s), float("-inf"), dtype=lse_dtype, device=like_q.device)
    return out, lse


def sink_gate(lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """g = sigmoid(lse - sink) (B, H, S) in lse's dtype: the share of a query's softmax mass its
    keys keep beside its head's sink (lse = -inf: 0)."""
    return torch.sigmoid(lse - sinks.to(lse.dtype).view(1, -1, 1))


def add_sink(out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """out (bshd) of queries whose (out, lse) is final over every key, with their heads' sinks
    (H,) in the softmax denominator: out * g, in out's dtype (the product in lse's)."""
    return (out * _bshd(sink_gate(lse, sinks))).to(out.dtype)


def sink_backward(dout: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(the dO the attention's own backward takes, dsinks (H,) over these queries), for queries
    whose sunk output is `out` (`add_sink`'s) and lse the one it used. With O' = g * O as the
    kernel's O and g * dO as its dO, the kernel's dS = P (g dO.v - g dO.O') is the sunk
    softmax's P' (dP' - dO.O'), P' = g P; dsink = -sum (dO . O')(1 - g)."""
    work = lse.dtype
    rest = torch.sigmoid(sinks.to(work).view(1, -1, 1) - lse)  # 1 - g, without the cancellation
    dot = torch.einsum("bshd,bshd->bhs", dout.to(work), out.to(work))
    dsinks = -(dot * rest).sum(dim=(0, 2))
    return (dout * _bshd(sink_gate(lse, sinks))).to(dout.dtype), dsinks
