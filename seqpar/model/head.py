"""The LM head with cross-entropy: unfused (logits in full) and fused (BurstEngine §3.3, Alg. 3).

The fused head walks the tokens in tiles and, per token tile, the vocabulary in tiles twice: once
for the log-sum-exp (online over vocabulary tiles), once for the softmax gradient. The gradients of
the hidden states and of the head weight are accumulated during the forward pass, so no logits are
kept for backward and at most one (token tile x vocabulary tile) block of them exists at a time;
backward only scales the stored gradients by the incoming one.

Precision. The unfused head is the plain one: logits from a matrix product in the compute dtype,
then cross-entropy in float32 (float64 for float64 inputs). The fused head keeps float32 from the
logits on, from 16-bit inputs: each vocabulary tile of the weight is cast to the compute dtype as
it is used (the weight itself may be the fp32 master), the logits are the product accumulated
*and returned* in float32 (on CUDA `mm(..., out_dtype=float32)`, the tensor cores' own float32
accumulator; elsewhere the float32 product of the same 16-bit values), so no logit is rounded to
16 bits; log-sum-exp, loss and softmax are float32; the two gradient products take the float32
probabilities rounded to the compute dtype on CUDA (tensor cores; float32 elsewhere) and accumulate
into float32 dh and dW. dW is handed back in the dtype of the weight passed in: float32 for an fp32
master weight (replicated states), the compute dtype under FSDP2 mixed precision, which gathers
the weight in it (FSDP then reduces that gradient in the master dtype).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32, or the input's dtype where it is wider."""
    return torch.promote_types(dtype, torch.float32)


def unfused_loss_sum(h: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum of token cross-entropies of logits h @ weight^T (all logits materialised)."""
    logits = F.linear(h.reshape(-1, h.shape[-1]), weight)
    return F.cross_entropy(logits.to(accumulation_dtype(h.dtype)), labels.reshape(-1),
                           reduction="sum")


_MM_OUT_DTYPE = hasattr(torch.ops.aten.mm, "dtype")  # mm(a, b, out_dtype=): torch >= 2.8, CUDA


def _mm(a: torch.Tensor, b: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    """a @ b accumulated and returned in `acc`: 16-bit CUDA inputs keep the tensor cores
    (out_dtype), anything else is multiplied in `acc`."""
    sixteen = a.dtype in (torch.float16, torch.bfloat16)
    if a.is_cuda and _MM_OUT_DTYPE and sixteen and acc == torch.float32:
        return torch.mm(a, b.to(a.dtype), out_dtype=acc)
    return a.to(acc) @ b.to(acc)


class _FusedHeadLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, labels, token_tile: int, vocab_tile: int):
        m, vocab = h.shape[0], weight.shape[0]
        acc = accumulation_dtype(h.dtype)
        grad_in = h.dtype if h.is_cuda else acc  # the gradient products' inputs
        dh = torch.zeros(h.shape, dtype=acc, device=h.device)
        dw = torch.zeros(weight.shape, dtype=acc, device=weight.device)
        total = torch.zeros((), dtype=acc, device=h.device)
        for t0 in range(0, m, token_tile):
            ht, lt = h[t0:t0 + token_tile], labels[t0:t0 + token_tile]
            lse = torch.full((ht.shape[0],), float("-inf"), dtype=acc, device=h.device)
            for v0 in range(0, vocab, vocab_tile):
                wv = weight[v0:v0 + vocab_tile].to(h.dtype)
                lse = torch.logaddexp(lse, torch.logsumexp(_mm(ht, wv.T, acc), -1))
            label_w = weight[lt].to(h.dtype)
            total += (lse - (ht.to(acc) * label_w.to(acc)).sum(-1)).sum()
            for v0 in range(0, vocab, vocab_tile):
                wv = weight[v0:v0 + vocab_tile].to(h.dtype)
                p = _mm(ht, wv.T, acc).sub_(lse[:, None]).exp_()
                # minus one at each label inside this tile (no nonzero(): no host sync on CUDA)
                inside = ((lt >= v0) & (lt < v0 + wv.shape[0])).to(acc)
                column = (lt - v0).clamp(0, wv.shape[0] - 1)
                p.scatter_add_(1, column[:, None], -inside[:, None])
                p = p.to(grad_in)
                dh[t0:t0 + token_tile] += _mm(p, wv, acc)
                dw[v0:v0 + vocab_tile] += _mm(p.T, ht, acc)
        ctx.save_for_backward(dh, dw)
        ctx.dtypes = (h.dtype, weight.dtype)
        return total

    @staticmethod
    def backward(ctx, grad):
        dh, dw = ctx.saved_tensors
        h_dtype, w_dtype = ctx.dtypes
        return (dh * grad).to(h_dtype), (dw * grad).to(w_dtype), None, None, None


def fused_loss_sum(h: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                   token_tile: int = 1024, vocab_tile: int = 8192) -> torch.Tensor:
    """Sum of token cross-entropies, tiled; equal to `unfused_loss_sum` with gradients for h and
    weight. `weight` may be stored wider than h (an fp32 master): its tiles are cast to h's dtype
    as they are used and its gradient comes back in its own dtype."""
    flat = h.reshape(-1, h.shape[-1])
    return _FusedHeadLoss.apply(flat, weight, labels.reshape(-1), token_tile, vocab_tile)
