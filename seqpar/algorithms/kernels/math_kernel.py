"""The math backend: explicit attention in float32 (float64 for float64 inputs), the reference the
other backends are tested against, and the one that takes any mask and dtype."""

from __future__ import annotations

import torch

from seqpar.algorithms.kernels.tensors import acc_dtype, expand_kv, finite_lse, reduce_kv


def _math_scores(q, k, causal, scale, keep=None):
    work = acc_dtype(q.dtype)
    kx = expand_kv(k, q.shape[2]).to(work)
    scores = torch.einsum("bqhd,bkhd->bhqk", q.to(work), kx) * scale
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        keep = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    return scores


def math_forward(q, k, v, causal, scale, keep=None):
    scores = _math_scores(q, k, causal, scale, keep)
    lse = torch.logsumexp(scores, dim=-1)
    p = torch.exp(scores - finite_lse(lse).unsqueeze(-1))
    out = torch.einsum("bhqk,bkhd->bqhd", p, expand_kv(v, q.shape[2]).to(p.dtype))
    return out.to(q.dtype), lse


def math_backward(dout, q, k, v, out, lse, causal, scale, keep=None):
    h, hkv = q.shape[2], k.shape[2]
    scores = _math_scores(q, k, causal, scale, keep)
    p = torch.exp(scores - finite_lse(lse.to(scores.dtype)).unsqueeze(-1))
    work = p.dtype
    do, vx = dout.to(work), expand_kv(v, h).to(work)
    dp = torch.einsum("bqhd,bkhd->bhqk", do, vx)
    delta = (do * out.to(work)).sum(-1).transpose(1, 2).unsqueeze(-1)  # rowsum(dO * O)
    ds = p * (dp - delta) * scale
    dq = torch.einsum("bhqk,bkhd->bqhd", ds, expand_kv(k, h).to(work))
    dk = torch.einsum("bhqk,bqhd->bkhd", ds, q.to(work))
    dv = torch.einsum("bhqk,bqhd->bkhd", p, do)
    return dq.to(q.dtype), reduce_kv(dk, hkv).to(k.dtype), reduce_kv(dv, hkv).to(v.dtype)
