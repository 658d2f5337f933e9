"""Attention sinks on one process: the 16-bit path (the gate in the accumulation dtype, out in the
inputs' dtype, dsinks in the sinks'), and the one-line refusals (a sinks tensor of the wrong shape,
an attention that adds no sinks, sinks bound into seq-attn's attend). Exactness in float64 under
every algorithm and checkpointing mode: tests/multirank/test_sinks.py."""

from __future__ import annotations

import functools

import pytest
import torch

from seqpar import algorithms
from seqpar.algorithms.base import Attention
from seqpar.errors import ConfigError
from seqpar.model import checkpointing
from seqpar.peers.adapter import Peer
from seqpar.rules.shape import TOLERANCE
from tests.multirank.test_sinks import (
    BLOCKS,
    block_inputs,
    block_parts,
    error,
    inputs,
    keep_of,
    reference,
)

CASE = ("local", "contiguous", True, 24, (0, 9, 24), 7, 4, 2)  # documents, a window, GQA


@pytest.mark.parametrize("dtype,sink_dtype", [(torch.bfloat16, torch.float32),
                                              (torch.float32, torch.bfloat16)])
def test_sinks_in_16_and_32_bits_follow_the_reference(seed, dtype, sink_dtype):
    x = inputs(CASE, seed)
    want = reference(x, keep_of(CASE))
    attn = algorithms.build_attention("local", causal=True, window=7)
    q, k, v = (x[n].to(dtype).requires_grad_() for n in ("q", "k", "v"))
    sinks = x["sinks"].to(sink_dtype).requires_grad_()
    out = attn(q, k, v, cu_seqlens=CASE[4], sinks=sinks)
    out.backward(x["dout"].to(dtype))
    assert (out.dtype, q.grad.dtype, sinks.grad.dtype) == (dtype, dtype, sink_dtype)
    got = {"out": out, "dq": q.grad, "dk": k.grad, "dv": v.grad, "dsinks": sinks.grad}
    bound = TOLERANCE["bfloat16" if torch.bfloat16 in (dtype, sink_dtype) else "float32"]
    for name, t in got.items():
        assert error(t.detach().double(), want[name]) <= bound, name


def test_sinks_of_the_wrong_shape_are_refused_in_one_line():
    attn = algorithms.build_attention("local", causal=True)
    q = torch.randn(1, 8, 4, 4)
    with pytest.raises(ConfigError, match=r"sinks\.shape.*\(4,\)"):
        attn(q, q, q, sinks=torch.zeros(2))
    with pytest.raises(ConfigError, match=r"sinks\.shape"):
        attn(q, q, q, sinks=torch.zeros(4, dtype=torch.long))


def test_every_algorithm_adds_sinks_and_a_peer_refuses_them():
    assert all(cls.takes_sinks for cls in algorithms.REGISTRY.values())
    assert not Peer.takes_sinks
    attn = algorithms.build_attention("local", causal=True)
    attn.algo.__class__ = type("NoSinks", (type(attn.algo),), {"takes_sinks": False})
    q = torch.randn(1, 8, 4, 4)
    with pytest.raises(ConfigError, match="adds no sinks"):
        Attention(attn.algo)(q, q, q, sinks=torch.zeros(4))


def test_seq_attn_takes_sinks_from_run_block_not_a_bound_partial():
    attn = algorithms.build_attention("local", causal=True)
    spec = BLOCKS[0]
    x = block_inputs(spec, 0)
    pre, post = block_parts(x, spec[5], spec[6])
    with pytest.raises(ConfigError, match="run_block"):
        checkpointing.run_block(pre, post, functools.partial(attn, sinks=x["sinks"]),
                                x["x"].requires_grad_(), x["cos"], x["sin"], "seq-attn", 0.5)
