"""Activation checkpointing of one block: which activations are kept for backward, which recomputed.

A block is `pre` (RMSNorm, Q/K/V projections, RoPE: token-wise), the distributed attention, and
`post` (output projection, residual, RMSNorm, SwiGLU, residual: token-wise). The modes:

- `none`: everything autograd saves is kept.
- `full`: only the block input is kept; backward re-runs the whole block, the distributed attention
  and its communication included (the classic scheme; the ledger shows the second forward).
- `sc++` (LoongTrain §5.2, WallFacer §4.6): the attention output and its lse are kept; `pre` and
  `post` are recomputed, and so are the q, k, v the attention saved (locally, from the block
  input: hooks swap them for a recipe when the algorithm saves its inputs as they are). The
  distributed attention and its communication never run twice.
- `sequence` with a fraction f (seqpar's own split of the token-wise layers): the token-wise
  activations of the first f of the rank's tokens are recomputed, those of the rest are kept. The
  distributed attention is one op over the whole shard and is not split: its saved state (q, k, v,
  out, lse) is kept whole.
- `sc++,sequence`: `sequence`'s split, and the attention keeps only out + lse as in `sc++`.
- `seq-attn` with a fraction F (BurstEngine §3.2, sequence-level selective checkpointing; its
  code's `seq-wise` mode): the whole block is checkpointed, and the attention output and lse of
  the rank's tokens after its first F are kept. Backward's recompute re-runs the block, and the
  distributed attention for the prefix only: the first F of every rank's tokens are the first F·N
  tokens of the sequence (stripe; zigzag at 1/2, whose prefix is the contiguous layout of N/2),
  whose queries see no later key, so the prefix's attention is the attention of those F·N tokens
  on their own (its ring carries the prefix's K,V; the ledger books it as a forward). The
  prefix's out and lse are joined to the kept ones and the attention's own backward runs on the
  whole (`rules.memory.check_seq_attn`: where a prefix is dealt so, and which attentions allow it).

Every mode computes the same numbers (same ops, the same token split; seq-attn's prefix to the
rounding of a merge order), so each is exact. Attention sinks (`run_block(..., sinks=)`, gpt-oss's
logit per query head) reach the attention in every mode: what sc++ and seq-attn keep is the sunk
out with the lse over the keys alone, as the algorithm saves it (a prefix's lse is final, so its
sink is added as the whole call's is), and the sinks' gradient flows through each mode.
"""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint

from seqpar.algorithms import layouts, ledger
from seqpar.algorithms.base import Algorithm, algorithm_backward, call_relation
from seqpar.errors import require
from seqpar.rules.flops import recomputed_tokens
from seqpar.rules.memory import CHECKPOINT_MODES, check_seq_attn, prefix_layout, uses_fraction

SEQ_ATTN = "seq-attn"
# the modes every attention trains in every layout (seq-attn has rules of its own: check_seq_attn)
MODES = tuple(m for m in CHECKPOINT_MODES if m != SEQ_ATTN)


def check_mode(mode: str, fraction: float) -> None:
    require(mode in CHECKPOINT_MODES, "checkpoint", mode,
            f"must be one of {', '.join(CHECKPOINT_MODES)}")
    require(isinstance(fraction, int | float) and 0.0 <= fraction <= 1.0, "seq_fraction", fraction,
            "must be in [0, 1] (the part of each rank's tokens recomputed)")


__all__ = ["CHECKPOINT_MODES", "MODES", "SEQ_ATTN", "check_mode", "check_seq_attn",
           "recomputed_tokens", "run_block", "uses_fraction"]


class _Recipe:
    """Stands in for a saved q, k or v: recomputes all three once, on the first unpack."""

    def __init__(self, make: Callable[[], tuple[torch.Tensor, ...]]):
        self.make, self.values, self.left = make, None, 3

    def take(self, index: int) -> torch.Tensor:
        if self.values is None:
            with torch.no_grad():
                self.values = self.make()
        value = self.values[index]
        self.left -= 1
        if self.left == 0:
            self.values = None
        return value


def _key(t: torch.Tensor) -> tuple:
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()))


@contextlib.contextmanager
def recompute_inputs(inputs: tuple[torch.Tensor, ...], make: Callable[[], tuple[torch.Tensor, ...]]):
    """While active, a saved tensor that *is* one of `inputs` is replaced by a recipe (`make`)."""
    keys = {_key(t): i for i, t in enumerate(inputs)}
    recipe = _Recipe(make)

    def pack(t: torch.Tensor):
        index = keys.get(_key(t))
        return t if index is None else (recipe, index)

    def unpack(packed):
        if isinstance(packed, tuple):
            return packed[0].take(packed[1])
        return packed

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def _recomputed(fn: Callable, *args):
    """fn(*args) keeping only its inputs; the model draws no random numbers, so no RNG state.
    The recomputation books its communication into the ledgers active now: autograd may run it on
    another thread (CUDA's device thread), where this thread's context is not set."""
    saved = ledger.active()
    return checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=False,
                      context_fn=lambda: (contextlib.nullcontext(), ledger.replay_of(saved)))


def run_block(pre: Callable, post: Callable, attend: Callable, x: torch.Tensor, cos: torch.Tensor,
              sin: torch.Tensor, mode: str, fraction: float,
              sinks: torch.Tensor | None = None) -> torch.Tensor:
    """One block's output under a checkpointing mode (see the module docstring); `sinks`: the
    layer's attention sinks (heads,), passed to `attend(q, k, v, sinks=)` (None: none)."""
    if mode == "full":
        return _recomputed(run_block, pre, post, attend, x, cos, sin, "none", 0.0, sinks)
    if mode == SEQ_ATTN and torch.is_grad_enabled():
        calls, m = _seq_attn_calls(attend, x.shape[1], fraction, sinks)
        return _recomputed(_seq_attn_block, pre, post, calls, _Kept(), m, x, cos, sin, sinks)
    if mode == SEQ_ATTN:
        return run_block(pre, post, attend, x, cos, sin, "none", 0.0, sinks)
    s = x.shape[1]
    m = recomputed_tokens(mode, fraction, s)
    spans = [(a, b) for a, b in ((0, m), (m, s)) if b > a]

    def pre_parts(xx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outs = []
        for a, b in spans:
            args = (xx[:, a:b], cos[:, a:b], sin[:, a:b])
            outs.append(_recomputed(pre, *args) if a < m and xx.requires_grad else pre(*args))
        return tuple(_cat([o[i] for o in outs]).contiguous() for i in range(3))

    q, k, v = pre_parts(x)
    hooks = contextlib.nullcontext()
    if mode in ("sc++", "sc++,sequence"):
        hooks = recompute_inputs((q, k, v), lambda: pre_parts(x.detach()))
    with hooks:
        a = attend(q, k, v) if sinks is None else attend(q, k, v, sinks=sinks)
    outs = []
    for a0, b0 in spans:
        args = (x[:, a0:b0], a[:, a0:b0])
        outs.append(_recomputed(post, *args) if a0 < m else post(*args))
    return _cat(outs)


# -------------------------------------------------------------------------------------- seq-attn
class _Kept:
    """What seq-attn keeps of one block's attention from its forward to its backward: the output
    and lse of the rank's tokens after the prefix."""

    def __init__(self) -> None:
        self.out: torch.Tensor | None = None
        self.lse: torch.Tensor | None = None


def _seq_attn_calls(attend: Callable, s: int, fraction: float, sinks: torch.Tensor | None
                    ) -> tuple[tuple[Algorithm, Algorithm | None], int]:
    """(the whole call's algorithm, the prefix call's or None), and the prefix's rows a rank: the
    call `attend` makes (a built attention, or one with the step's packed documents) and the same
    attention over the first `fraction` x N tokens alone, in the layout that deals them; both
    with the call's `sinks`."""
    attention, kw = ((attend.func, dict(attend.keywords)) if isinstance(attend, functools.partial)
                     else (attend, {}))
    a: Algorithm = attention.algo
    require("sinks" not in kw, "checkpoint", "seq-attn",
            "takes the attention sinks as run_block(..., sinks=), not bound into attend")
    mask = kw.get("mask") or a.mask
    require(mask is None or mask.relation is not None, "checkpoint", "seq-attn",
            "splits causal attention, packed documents or a causal window, not a mask of slices")
    causal, window = a.causal, a.window
    cu = layouts.as_cu(kw.get("cu_seqlens"))
    if mask is not None:
        causal, window, cu = mask.relation.causal, mask.relation.window, mask.cu
    n = s * a.world
    check_seq_attn(a.name, a.layout, fraction, a.world, n,
                   documents=cu is not None and len(cu) > 2, causal=causal)
    full = a.for_call(call_relation(a.layout, a.world, n, causal, cu, window), sinks)
    m = int(round(fraction * s))
    if m == 0:
        return (full, None), 0
    head = copy.copy(a)
    head.layout = prefix_layout(a.layout, a.world, fraction)
    n_head = m * a.world
    cu_head = None if cu is None else tuple(c for c in cu if c < n_head) + (n_head,)
    return (full, head.for_call(call_relation(head.layout, a.world, n_head, causal, cu_head,
                                              window), sinks)), m


def _seq_attn_block(pre: Callable, post: Callable, calls: tuple, kept: _Kept, m: int,
                    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                    sinks: torch.Tensor | None) -> torch.Tensor:
    q, k, v = (t.contiguous() for t in pre(x, cos, sin))
    return post(x, _SeqAttn.apply(calls, kept, m, q, k, v, sinks))


class _SeqAttn(torch.autograd.Function):
    """The distributed attention under seq-attn. Forward (the block's first run, its saved tensors
    dropped by the checkpoint): the whole attention, the rest's out and lse kept. Forward again
    (backward's recompute): the prefix's attention alone, joined to what was kept. Backward: the
    attention's own, over the whole shard. `sinks` (the calls carry them) is an input for its
    gradient."""

    @staticmethod
    def forward(ctx, calls, kept: _Kept, m: int, q, k, v, sinks):
        # the checkpoint runs backward on the first forward's node (its ctx: the whole call's
        # algorithm and state) with the tensors the recompute saved (the joined out and lse)
        full, head = calls
        state = None
        if kept.out is None:
            out, saved, state = full.forward(q, k, v)
            lse = saved[4]
            kept.out, kept.lse = out[:, m:].clone(), lse[..., m:].clone()
        else:
            out, lse = kept.out, kept.lse
            if m:
                part, saved, _ = head.forward(*(t[:, :m].contiguous() for t in (q, k, v)))
                out = torch.cat([part.to(out.dtype), out], dim=1)
                lse = torch.cat([saved[4].to(lse.dtype), lse], dim=-1)
            kept.out = kept.lse = None
        ctx.algo, ctx.state, ctx.ledgers = full, state, ledger.active()
        ctx.dtypes = (q.dtype, k.dtype, v.dtype, None if sinks is None else sinks.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, dout):
        return (None, None, None, *algorithm_backward(ctx, dout))
