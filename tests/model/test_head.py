"""The fused LM head + cross-entropy (BurstEngine Alg. 3) equals the unfused one in float64 (loss,
hidden-state and weight gradients) for ragged tiles, and its forward peak is lower by at least the
logits' N x V x e bytes at two vocabulary sizes (unfused holds logits and log-probabilities)."""

from __future__ import annotations

import pytest
import torch

from seqpar.model.head import fused_loss_sum, unfused_loss_sum
from seqpar.model.measure import head_memory


@pytest.mark.parametrize(("tokens", "vocab", "tiles"), [(37, 101, (8, 16)), (64, 50, (64, 50)),
                                                        (5, 300, (2, 7))])
def test_fused_head_matches_unfused(tokens, vocab, tiles):
    gen = torch.Generator().manual_seed(tokens + vocab)
    h = torch.randn(2, tokens, 24, generator=gen, dtype=torch.float64)
    w = torch.randn(vocab, 24, generator=gen, dtype=torch.float64) * 0.3
    labels = torch.randint(0, vocab, (2, tokens), generator=gen)
    grads = []
    for fn in (unfused_loss_sum, lambda a, b, c: fused_loss_sum(a, b, c, *tiles)):
        hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
        loss = fn(hh, ww, labels)
        (loss * 0.7).backward()
        grads.append((loss.detach(), hh.grad, ww.grad))
    for a, b in zip(*grads, strict=True):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("vocab", (4096, 16384))
def test_fused_head_peak_is_lower_by_the_logits(vocab):
    r = head_memory(512, 64, vocab, token_tile=128, vocab_tile=1024)
    assert r["saved"] >= r["logits_bytes"], r
    assert r["fused_retained"] < r["logits_bytes"] / 4, r
