"""`seqpar plan --max-seq`: the longest sequence each configuration fits in a device's memory.

By the planner's own memory model (the peak `seqpar plan` compares to the device: the attention
layer's in the attention scope, a training step's in the model scope), searched over the lengths
the configuration accepts: multiples of its granularity (the smallest length its rules accept, e.g.
2P for zigzag), doubling until it no longer fits, then bisecting. Peak memory grows with the length.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from seqpar import algorithms
from seqpar.algorithms.base import AttnShape
from seqpar.algorithms.layouts import LAYOUTS, chunk_count
from seqpar.errors import ConfigError, require
from seqpar.experiments.clusters import Cluster
from seqpar.experiments.perf.api import attention_peak
from seqpar.experiments.perf.plan import Space, model_shape
from seqpar.experiments.perf.step import CHECKPOINTS, step_peak

LIMIT = 1 << 40  # tokens: no device holds more


@dataclass
class MaxSeq:
    algorithm: str
    options: dict[str, Any]
    layout: str
    max_tokens: int       # 0: not even the shortest length fits
    granularity: int      # valid lengths are its multiples
    peak_mem_bytes: int   # predicted at max_tokens (at the granularity when none fits)

    def json(self) -> dict[str, Any]:
        return {"algorithm": self.algorithm, "options": self.options, "layout": self.layout,
                "max_tokens": self.max_tokens, "granularity": self.granularity,
                "peak_mem_bytes": self.peak_mem_bytes}


def _valid(name: str, shape: AttnShape, world: int, layout: str, causal: bool,
           options: dict[str, Any]) -> bool:
    try:
        algorithms.check(name, shape, world, layout, causal, **options)
    except ConfigError:
        return False
    return True


def granularity(name: str, model: str, world: int, layout: str, options: dict[str, Any],
                causal: bool = True, dtype: str = "bfloat16") -> int | None:
    """The smallest length the configuration accepts (its multiples are the lengths it accepts),
    or None when no length does (a rule on heads or world, not on length)."""
    base = chunk_count(layout, world)
    for k in range(1, 65):
        if _valid(name, model_shape(model, base * k, dtype)[0], world, layout, causal, options):
            return base * k
    return None


def peak_at(name: str, model: str, seq_len: int, *, world: int, options: dict[str, Any],
            nodes: int = 1, checkpoint: str | None = None, dtype: str = "bfloat16") -> int:
    """The planner's predicted peak bytes per rank at seq_len (a step's with `checkpoint`)."""
    shape, cfg = model_shape(model, seq_len, dtype)
    attn = attention_peak(name, shape, world, options, nodes)
    return attn if checkpoint is None else step_peak(name, shape, world, options, cfg,
                                                     checkpoint, attn)


def max_seq(cluster: Cluster, model: str, world: int, space: Space, *, nodes: int = 1,
            scope: str = "attention", layouts: Sequence[str] = LAYOUTS, causal: bool = True,
            dtype: str = "bfloat16") -> list[MaxSeq]:
    """Per valid (algorithm, options, layout[, checkpoint]) the longest sequence that fits, longest
    first."""
    require(scope in ("attention", "model"), "scope", scope, "must be attention or model")
    require(scope == "attention" or model_shape(model, 1, dtype)[1] is not None, "model", model,
            "--scope model needs a model preset of seqpar.model.config")
    budget = cluster.memory_gb * 1e9
    out = []
    for name, options in space:
        grains = {lay: granularity(name, model, world, lay, dict(options), causal, dtype)
                  for lay in layouts}
        grains = {lay: g for lay, g in grains.items() if g is not None}
        if not grains:
            continue
        finest = min(grains.values())
        for ck in (CHECKPOINTS if scope == "model" else (None,)):
            peak = functools.partial(peak_at, name, model, world=world, options=dict(options),
                                     nodes=nodes, checkpoint=ck, dtype=dtype)
            # memory does not depend on the layout: search once at the finest granularity; a
            # coarser one (a multiple of it) takes the longest of its multiples below that
            longest = finest * _longest(lambda m, peak=peak, g=finest: peak(m * g) <= budget)
            opts = dict(options) if ck is None else {**options, "checkpoint": ck}
            for lay, g in grains.items():
                if g % finest == 0:
                    tokens = longest // g * g
                else:
                    tokens = g * _longest(lambda m, peak=peak, g=g: peak(m * g) <= budget)
                out.append(MaxSeq(name, opts, lay, tokens, g, peak(max(tokens, g))))
    return sorted(out, key=lambda r: -r.max_tokens)


def _longest(fits: Any) -> int:
    """The largest m >= 0 with fits(m) (fits holds up to some m and not beyond; fits(0) holds)."""
    if not fits(1):
        return 0
    lo, hi = 1, 2
    while fits(hi):
        lo, hi = hi, hi * 2
        if hi > LIMIT:
            return lo
    while hi - lo > 1:  # fits(lo), not fits(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo
