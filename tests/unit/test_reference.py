"""The float64 reference in blocks of query rows: the same numbers as in one block (forward and
every gradient, under causality, documents, windows and GQA), SDPA's on the unsharded sequence, and
no intermediate larger than a block of rows against all keys."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from seqpar.case import Case
from seqpar.workers.measure.reference import (
    BLOCK_SCORE_BYTES,
    GRADS,
    make_inputs,
    query_block,
    reference,
    reference_mask,
)

MASKS = {
    "causal": {},
    "full": {"causal": False},
    "documents": {"cu_seqlens": (0, 7, 30, 31, 64)},
    "window": {"window": 9},
    "documents+window": {"cu_seqlens": (0, 40, 64), "window": 5},
    "full+documents": {"causal": False, "cu_seqlens": (0, 20, 64)},
}


def case(seed: int, **kw) -> Case:
    return Case(**{"algorithm": "local", "world": 1, "batch": 2, "seq_len": 64, "heads": 4,
                   "kv_heads": 2, "head_dim": 8, "seed": seed, **kw})


@pytest.mark.parametrize("mask", list(MASKS))
def test_blocked_reference_equals_one_block(mask, seed):
    c = case(seed, **MASKS[mask])
    block = random.Random(seed).randint(1, c.seq_len - 1)  # any size, dividing N or not
    whole = reference(c, block=c.seq_len)
    blocked = reference(c, block=block)
    for name in GRADS:
        assert torch.allclose(blocked[name], whole[name], rtol=0, atol=1e-12), (name, block)


@pytest.mark.parametrize("mask", list(MASKS))
def test_reference_is_sdpa_on_the_unsharded_sequence(mask, seed):
    c = case(seed, **MASKS[mask])
    inputs = make_inputs(c)
    q, k, v = (inputs[n].clone().requires_grad_() for n in ("q", "k", "v"))
    out = F.scaled_dot_product_attention(  # every head at once, with torch's own causal mask
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True,
        attn_mask=reference_mask(c) if c.cu_seqlens or c.window else None,
        is_causal=c.causal and not (c.cu_seqlens or c.window)).transpose(1, 2)
    out.backward(inputs["dout"])
    want = {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}
    got = reference(c, block=5)
    for name in GRADS:
        assert torch.allclose(got[name], want[name], rtol=0, atol=1e-12), name


class _LargestTensor(TorchDispatchMode):
    """The most elements of any tensor an op returns inside the block (forward and backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.numel = max(self.numel, t.numel())
        return out


@pytest.mark.parametrize("mask", [{}, {"cu_seqlens": (0, 100, 256), "window": 30}])
def test_no_intermediate_is_larger_than_a_block_of_rows(mask, seed):
    c = case(seed, **mask, batch=1, seq_len=256, heads=2, kv_heads=1, head_dim=4)
    block = 16  # block x N = 4096 elements; q, k, v of the whole sequence are at most 2048
    with _LargestTensor() as seen:
        reference(c, block=block)
    assert seen.numel <= c.batch * block * c.seq_len, seen.numel  # one block's scores, never N x N


def test_default_block_bounds_the_scores_and_keeps_short_sequences_whole():
    assert query_block(case(0, seq_len=64)) == 64
    long = case(0, batch=1, seq_len=65536)
    assert query_block(long) * long.seq_len * 8 <= BLOCK_SCORE_BYTES and query_block(long) >= 64
