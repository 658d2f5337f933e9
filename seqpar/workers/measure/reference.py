"""The float64 reference every correctness number is held against, and its one tolerance rule.

`make_inputs` draws a case's full-sequence inputs; `reference` is attention in float64 on them, in
one process, written independently of the algorithms: torch's scaled_dot_product_attention, one
query head and one block of query rows at a time (a K,V head's gradients sum over its query heads
and the blocks), under `reference_mask` (the explicit mask of causality, documents and window, from
the definition, not from `layouts.Relation`). Its memory is O(block x N) per head, not O(N^2):
at N = 64K one head's full score matrix alone is 34 GB in float64.
An error is max |x - ref| over max |ref| (`error_scale`: at least `SCALE_FLOOR`), held to the
dtype's `TOLERANCE`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from seqpar.case import Case
from seqpar.rules.shape import TOLERANCE  # noqa: F401 (the bound, also from here)

GRADS = ("out", "dq", "dk", "dv")
# relative tolerance (max |error| / max |reference|) by dtype
# the float64 scores of one block of query rows against all N keys: 64 MiB at most (the block's
# other intermediates are a few times this), whatever N
BLOCK_SCORE_BYTES = 64 << 20
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


def query_block(case: Case) -> int:
    """Query rows per block of the reference: one block's float64 scores (batch x rows x N) within
    BLOCK_SCORE_BYTES, so its memory is O(rows x N), not O(N^2); all N rows when they fit."""
    per_row = case.batch * case.seq_len * 8
    return max(1, min(case.seq_len, BLOCK_SCORE_BYTES // per_row))


def reference_mask(case: Case, start: int = 0, stop: int | None = None) -> torch.Tensor | None:
    """Rows start..stop (default: all N) of the explicit boolean mask (rows, N) of causality,
    documents and window (True: visible), written from the definition, independently of
    `layouts.Relation`; None where every query sees every key (full attention, one document)."""
    n = case.seq_len
    stop = n if stop is None else stop
    if case.mask:  # any mask: its dense rows, from its slices' definition
        return torch.from_numpy(case.attention_mask.dense(start, stop))
    if not (case.causal or case.cu_seqlens or case.window is not None):
        return None
    keys, queries = torch.arange(n), torch.arange(start, stop)
    cu = torch.tensor(case.cu_seqlens or (0, n))
    doc = torch.repeat_interleave(torch.arange(len(cu) - 1), cu[1:] - cu[:-1])
    keep = doc[queries, None] == doc[None, :]
    if case.causal:
        keep &= queries[:, None] >= keys[None, :]
    if case.window is not None:
        keep &= (queries[:, None] - keys[None, :]).abs() < case.window
    return keep


def _seen_keys(mask: torch.Tensor | None, n: int) -> tuple[int, int]:
    """The keys [lo, hi) some row of a block's mask sees (all N without a mask; one key when no
    row sees any: those rows' results are zero)."""
    if mask is None:
        return 0, n
    seen = mask.any(dim=0).nonzero()
    if seen.numel() == 0:
        return 0, 1
    return int(seen[0]), int(seen[-1]) + 1


def reference(case: Case, inputs: dict[str, torch.Tensor] | None = None,
              device: torch.device | str = "cpu", block: int | None = None
              ) -> dict[str, torch.Tensor]:
    """out, dq, dk, dv (float64, on `device`) of single-process attention on `inputs` (default: the
    case's `make_inputs`) under the case's mask, one query head and one block of `block` query
    rows (default `query_block`) at a time, against the keys its rows see (under causality those
    up to its last row): its out and dq rows are final, its dk, dv contributions add up over the
    blocks."""
    device = torch.device(device)
    inputs = make_inputs(case) if inputs is None else inputs
    n, g = case.seq_len, case.heads // case.kv_heads
    block = query_block(case) if block is None else block
    rows = [(a, min(a + block, n)) for a in range(0, n, block)]
    x = {name: t.to(device=device, dtype=torch.float64) for name, t in inputs.items()}
    ref = {"out": torch.empty_like(x["q"]), "dq": torch.empty_like(x["q"]),
           "dk": torch.zeros_like(x["k"]), "dv": torch.zeros_like(x["v"])}
    for h in range(case.heads):
        j = h // g  # the K,V head query head h reads (kernels: GQA)
        k, v = (x[t].narrow(2, j, 1).transpose(1, 2).clone().requires_grad_() for t in "kv")
        for a, b in rows:
            mask = reference_mask(case, a, b)
            lo, hi = _seen_keys(mask, n)  # keys no row of the block sees add exactly nothing
            # a row that sees no key has output 0 and gradient 0 (not SDPA's NaN): it attends to
            # one key under a zero upstream gradient, and its output is zeroed
            blind = None if mask is None else ~mask.any(dim=1)
            if blind is not None and bool(blind.any()):
                mask = mask.clone()
                mask[blind, lo] = True
            q = x["q"].narrow(2, h, 1).narrow(1, a, b - a).transpose(1, 2).clone().requires_grad_()
            out = F.scaled_dot_product_attention(
                q, k[:, :, lo:hi], v[:, :, lo:hi],
                attn_mask=None if mask is None else mask[:, lo:hi].to(device))
            dout = x["dout"].narrow(2, h, 1).narrow(1, a, b - a).transpose(1, 2)
            if blind is not None and bool(blind.any()):
                keep = (~blind).to(device).view(1, 1, -1, 1)
                out, dout = out * keep, dout * keep
            out.backward(dout)
            ref["out"].narrow(2, h, 1).narrow(1, a, b - a).copy_(out.detach().transpose(1, 2))
            ref["dq"].narrow(2, h, 1).narrow(1, a, b - a).copy_(q.grad.transpose(1, 2))
            del out, q, mask
        ref["dk"].narrow(2, j, 1).add_(k.grad.transpose(1, 2))
        ref["dv"].narrow(2, j, 1).add_(v.grad.transpose(1, 2))
    return ref
