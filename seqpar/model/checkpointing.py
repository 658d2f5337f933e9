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
- `sequence` with a fraction f (BurstEngine §3.2): the token-wise activations of the first f of the
  rank's tokens are recomputed, those of the rest are kept. The distributed attention is one op over
  the whole shard and is not split: its saved state (q, k, v, out, lse) is kept whole.
- `sc++,sequence`: `sequence`'s split, and the attention keeps only out + lse as in `sc++`.

Every mode computes the same numbers (same ops, same token split), so each is exact.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint

from seqpar.algorithms import ledger
from seqpar.errors import require

MODES = ("none", "full", "sc++", "sequence", "sc++,sequence")


def check_mode(mode: str, fraction: float) -> None:
    require(mode in MODES, "checkpoint", mode, f"must be one of {', '.join(MODES)}")
    require(isinstance(fraction, int | float) and 0.0 <= fraction <= 1.0, "seq_fraction", fraction,
            "must be in [0, 1] (the part of each rank's tokens recomputed)")


def recomputed_tokens(mode: str, fraction: float, s: int) -> int:
    """How many of the shard's first tokens have their token-wise activations recomputed."""
    if mode == "none":
        return 0
    if mode in ("sc++", "full"):
        return s
    return int(round(fraction * s))


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
              sin: torch.Tensor, mode: str, fraction: float) -> torch.Tensor:
    """One block's output under a checkpointing mode (see the module docstring)."""
    if mode == "full":
        return _recomputed(run_block, pre, post, attend, x, cos, sin, "none", 0.0)
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
        a = attend(q, k, v)
    outs = []
    for a0, b0 in spans:
        args = (x[:, a0:b0], a[:, a0:b0])
        outs.append(_recomputed(post, *args) if a0 < m else post(*args))
    return _cat(outs)
