"""The LM head with cross-entropy: unfused (logits in full) and fused (BurstEngine §3.3, Alg. 3).

The fused head walks the tokens in tiles and, per token tile, the vocabulary in tiles twice: once
for the log-sum-exp (online over vocabulary tiles), once for the softmax gradient. The gradients of
the hidden states and of the head weight are accumulated during the forward pass, so no logits are
kept for backward and at most one (token tile x vocabulary tile) block of them exists at a time;
backward only scales the stored gradients by the incoming one.

Both heads compute the logits' matrix products in the input dtype and everything after them — the
softmax, the loss, the log-sum-exp and (fused) the gradient accumulators — in float32 (or float64
for float64 inputs), so a bf16 model's loss and gradients do not drift as N x V grows.
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


class _FusedHeadLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, labels, token_tile: int, vocab_tile: int):
        m, vocab = h.shape[0], weight.shape[0]
        acc = accumulation_dtype(h.dtype)
        dh = torch.zeros(h.shape, dtype=acc, device=h.device)
        dw = torch.zeros(weight.shape, dtype=acc, device=weight.device)
        total = torch.zeros((), dtype=acc, device=h.device)
        for t0 in range(0, m, token_tile):
            ht, lt = h[t0:t0 + token_tile], labels[t0:t0 + token_tile]
            lse = torch.full((ht.shape[0],), float("-inf"), dtype=acc, device=h.device)
            for v0 in range(0, vocab, vocab_tile):
                logits = (ht @ weight[v0:v0 + vocab_tile].T).to(acc)
                lse = torch.logaddexp(lse, torch.logsumexp(logits, -1))
            total += (lse - (ht.to(acc) * weight[lt].to(acc)).sum(-1)).sum()
            for v0 in range(0, vocab, vocab_tile):
                wv = weight[v0:v0 + vocab_tile]
                p = torch.exp((ht @ wv.T).to(acc) - lse[:, None])
                # minus one at each label inside this tile (no nonzero(): no host sync on CUDA)
                inside = ((lt >= v0) & (lt < v0 + wv.shape[0])).to(acc)
                column = (lt - v0).clamp(0, wv.shape[0] - 1)
                p.scatter_add_(1, column[:, None], -inside[:, None])
                p = p.to(h.dtype)  # the products in the input dtype, as the unfused backward does
                dh[t0:t0 + token_tile] += p @ wv
                dw[v0:v0 + vocab_tile] += p.T @ ht
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
    """Sum of token cross-entropies, tiled; equal to `unfused_loss_sum` with gradients for h, weight."""
    flat = h.reshape(-1, h.shape[-1])
    return _FusedHeadLoss.apply(flat, weight, labels.reshape(-1), token_tile, vocab_tile)
