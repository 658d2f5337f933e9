"""`seqpar plan --max-seq`: the longest sequence each configuration fits in a device's memory.

By the planner's own memory model (the peak `seqpar plan` compares to the device: the attention
layer's in the attention scope, a training step's in the model scope, under each training policy),
searched over the lengths the configuration accepts: multiples of its granularity (the smallest
length its rules accept, e.g. 2P for zigzag), doubling until it no longer fits, then bisecting. Peak
memory grows with the length. The model scope tries the policies without offload or tiling unless
`offload` / `tiled` filters name them (each policy is a configuration of its own).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from seqpar.errors import ConfigError, require
from seqpar.planner import memory
from seqpar.planner.api import attention_peak
from seqpar.planner.clusters import Cluster
from seqpar.planner.policy import Filters, Policy
from seqpar.planner.policy import space as policy_space
from seqpar.planner.scopes import Space, model_shape
from seqpar.rules import algorithms
from seqpar.rules.layouts import LAYOUTS, chunk_count
from seqpar.rules.shape import AttnShape

LIMIT = 1 << 40  # tokens: no device holds more


@dataclass
class MaxSeq:
    algorithm: str
    options: dict[str, Any]
    layout: str
    max_tokens: int       # 0: not even the shortest length fits
    granularity: int      # valid lengths are its multiples
    peak_mem_bytes: int   # predicted at max_tokens (at the granularity when none fits)
    policy: Policy | None = None  # the training policy (model scope)

    def json(self) -> dict[str, Any]:
        return {"algorithm": self.algorithm, "options": self.options, "layout": self.layout,
                **(self.policy.fields() if self.policy else {}),
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
            nodes: int = 1, policy: Policy | None = None, dtype: str = "bfloat16",
            gpu: bool = True) -> int:
    """The planner's predicted peak bytes per rank at seq_len (a step's under `policy`, with
    NCCL's buffers on a GPU cluster)."""
    shape, cfg = model_shape(model, seq_len, dtype)
    attn = attention_peak(name, shape, world, options, nodes)
    if policy is None:
        return attn
    per_node = max(1, world // nodes)
    comms = memory.communicators(name, world, 1, policy.states, per_node) if gpu else 0
    return memory.step_memory(name, shape, world, options, cfg, policy.train(dtype), attn, dtype,
                              shards=policy.shards(1, world, per_node), comms=comms)["peak"]


def max_seq(cluster: Cluster, model: str, world: int, space: Space, *, nodes: int = 1,
            scope: str = "attention", layouts: Sequence[str] = LAYOUTS, causal: bool = True,
            dtype: str = "bfloat16", filters: Filters = Filters()) -> list[MaxSeq]:
    """Per valid (algorithm, options, layout[, policy]) the longest sequence that fits, longest
    first."""
    require(scope in ("attention", "model"), "scope", scope, "must be attention or model")
    require(scope == "attention" or model_shape(model, 1, dtype)[1] is not None, "model", model,
            "--scope model needs a decoder (a ModelConfig preset or file)")
    budget = cluster.memory_gb * 1e9
    out = []
    for name, options in space:
        grains = {lay: granularity(name, model, world, lay, dict(options), causal, dtype)
                  for lay in layouts}
        grains = {lay: g for lay, g in grains.items() if g is not None}
        if not grains:
            continue
        finest = min(grains.values())
        policies: list[Policy | None] = [None]
        if scope == "model":
            policies = list(policy_space(filters, 1, offload_sets=((),), tiled=(False,), sp=world,
                                         per_node=max(1, world // nodes)))
        for policy in policies:
            peak = functools.partial(peak_at, name, model, world=world, options=dict(options),
                                     nodes=nodes, policy=policy, dtype=dtype,
                                     gpu=cluster.cores is None)
            # memory does not depend on the layout: search once at the finest granularity; a
            # coarser one (a multiple of it) takes the longest of its multiples below that
            longest = finest * _longest(lambda m, peak=peak, g=finest: peak(m * g) <= budget)
            opts = dict(options)
            for lay, g in grains.items():
                if policy is not None and not policy.runs(name, lay, world, 2 * world * g):
                    continue  # seq-attn's rules: no global prefix in this layout
                if g % finest == 0:
                    tokens = longest // g * g
                else:
                    tokens = g * _longest(lambda m, peak=peak, g=g: peak(m * g) <= budget)
                out.append(MaxSeq(name, opts, lay, tokens, g, peak(max(tokens, g)), policy))
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
