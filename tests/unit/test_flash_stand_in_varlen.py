"""The flash-attn stand-in (flash_stand_in.py) catches a wrong varlen binding as flash-attn's C++
checks would: a correct call passes, each broken argument is refused with flash-attn's reason."""

from __future__ import annotations

import flash_stand_in as stand_in
import pytest
import torch

BREAKS = {
    "cu_seqlens int64": ("cu_seqlens_q", lambda a: a["cu_seqlens_q"].long(), "int32"),
    "cu_seqlens strided": ("cu_seqlens_k", lambda a: torch.tensor(
        [0, 9, 5, 9, 7, 9], dtype=torch.int32)[::2], "contiguous"),
    "cu_seqlens short of the packed rows": ("cu_seqlens_q", lambda a: torch.tensor(
        [0, 3, 4], dtype=torch.int32), "from 0 to"),
    "max_seqlen too small": ("max_seqlen_k", lambda a: 4, "longer than max_seqlen"),
    "lse as the dense (B, H, S)": ("softmax_lse", lambda a: a["softmax_lse"].unsqueeze(0),
                                   "softmax_lse must be"),
    "lse rows first": ("softmax_lse", lambda a: a["softmax_lse"].t(), "softmax_lse must be"),
    "lse transposed view": ("softmax_lse", lambda a: a["softmax_lse"].t().contiguous().t(),
                            "contiguous"),
    "lse in float16": ("softmax_lse", lambda a: a["softmax_lse"].half(), "float32"),
    "head dim not padded": ("q", lambda a: a["q"][..., :12], "multiple of 8"),
    "dq in float32": ("dq", lambda a: a["dq"].float(), "dtype of q"),
    "dout strided last dim": ("dout", lambda a: torch.randn(5, 4, 32).half()[..., ::2],
                              "contiguous last dimension"),
}


def test_the_stand_in_takes_a_correct_varlen_backward():
    args = stand_in.varlen_backward_arguments()
    stand_in._flash_attn_varlen_backward(**args)
    assert torch.isfinite(args["dq"].float()).all()


@pytest.mark.parametrize("name", BREAKS)
def test_the_stand_in_refuses_a_wrong_varlen_backward_binding(name):
    field, broken, message = BREAKS[name]
    args = stand_in.varlen_backward_arguments()
    args[field] = broken(args)
    with pytest.raises(AssertionError, match=message):
        stand_in._flash_attn_varlen_backward(**args)


def test_the_stand_in_refuses_a_wrong_varlen_forward_binding():
    a = stand_in.varlen_backward_arguments()
    ok = (a["q"], a["k"], a["v"], a["cu_seqlens_q"], a["cu_seqlens_k"], 3, 5)
    stand_in.flash_attn_varlen_func(*ok)
    for i, bad, message in [(3, a["cu_seqlens_q"].long(), "int32"), (5, 2, "max_seqlen"),
                            (0, a["q"].unsqueeze(0), "3-d"), (1, a["k"].float(), "same dtype")]:
        args = list(ok)
        args[i] = bad
        with pytest.raises(AssertionError, match=message):
            stand_in.flash_attn_varlen_func(*args)
