"""The float64 reference every correctness number is held against, and its one tolerance rule.

`make_inputs` draws a case's full-sequence inputs; `reference` is attention in float64 on them, in
one process, written independently of the algorithms: torch's scaled_dot_product_attention, one
query head at a time (a K,V head's gradients sum over its query heads), under `reference_mask` (the
explicit mask of documents and window, from the definition, not from `layouts.Relation`).
An error is max |x - ref| over max |ref| (`error_scale`: at least `SCALE_FLOOR`), held to the
dtype's `TOLERANCE`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from seqpar.case import Case

GRADS = ("out", "dq", "dk", "dv")
# relative tolerance (max |error| / max |reference|) by dtype
TOLERANCE = {"float64": 1e-10, "float32": 2e-5, "bfloat16": 3e-2, "float16": 5e-3}
# a gradient that vanishes (dq, dk at window 1: every query sees only itself) is held to its
# absolute error over this, not to rounding noise over noise
SCALE_FLOOR = 1e-4


def error_scale(ref: torch.Tensor) -> float:
    """What an error in `ref`'s tensor is relative to: max |ref|, at least SCALE_FLOOR."""
    return max(float(ref.abs().max()), SCALE_FLOOR)


def make_inputs(case: Case) -> dict[str, torch.Tensor]:
    """Full-sequence q, k, v and the upstream gradient, float64, drawn from case.seed."""
    g = torch.Generator().manual_seed(case.seed)
    b, n, h, hkv, d = case.batch, case.seq_len, case.heads, case.kv_heads, case.head_dim
    return {
        "q": torch.randn(b, n, h, d, generator=g, dtype=torch.float64),
        "k": torch.randn(b, n, hkv, d, generator=g, dtype=torch.float64),
        "v": torch.randn(b, n, hkv, d, generator=g, dtype=torch.float64),
        "dout": torch.randn(b, n, h, d, generator=g, dtype=torch.float64),
    }


def reference_mask(case: Case) -> torch.Tensor | None:
    """The explicit boolean mask (N, N) of documents and window (True: visible), written from the
    definition, independently of `layouts.Relation`; None for plain causal or full."""
    if not case.cu_seqlens and case.window is None:
        return None
    n = case.seq_len
    t = torch.arange(n)
    cu = torch.tensor(case.cu_seqlens or (0, n))
    doc = torch.repeat_interleave(torch.arange(len(cu) - 1), cu[1:] - cu[:-1])
    keep = doc[:, None] == doc[None, :]
    if case.causal:
        keep &= t[:, None] >= t[None, :]
    if case.window is not None:
        keep &= (t[:, None] - t[None, :]).abs() < case.window
    return keep


def reference(case: Case, inputs: dict[str, torch.Tensor] | None = None,
              device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """out, dq, dk, dv (float64, on `device`) of single-process attention on `inputs` (default: the
    case's `make_inputs`) under the case's mask, one query head at a time."""
    device = torch.device(device)
    inputs = make_inputs(case) if inputs is None else inputs
    mask = reference_mask(case)
    mask = mask.to(device) if mask is not None else None
    g = case.heads // case.kv_heads
    x = {name: t.to(device=device, dtype=torch.float64) for name, t in inputs.items()}
    outs, dqs = [], []
    dk, dv = torch.zeros_like(x["k"]), torch.zeros_like(x["v"])
    for h in range(case.heads):
        j = h // g  # the K,V head query head h reads (kernels: GQA)
        q = x["q"].narrow(2, h, 1).clone().requires_grad_()
        k, v = (x[n].narrow(2, j, 1).clone().requires_grad_() for n in ("k", "v"))
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
            is_causal=case.causal and mask is None).transpose(1, 2)
        out.backward(x["dout"].narrow(2, h, 1))
        outs.append(out.detach())
        dqs.append(q.grad)
        dk.narrow(2, j, 1).add_(k.grad)
        dv.narrow(2, j, 1).add_(v.grad)
    return {"out": torch.cat(outs, dim=2), "dq": torch.cat(dqs, dim=2), "dk": dk, "dv": dv}
