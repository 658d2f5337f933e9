"""Distributed attention algorithms: pure torch + torch.distributed (no Ray, no MLflow).

    attn = build_attention("ring", causal=True, layout="zigzag", group=my_sp_group)
    out = attn(q, k, v)          # local shards, (batch, seq, heads, head_dim)
    out.backward(grad)           # distributed and exact, too

Each algorithm states its rules (`check`) and its analytic bytes per rank per call
(`expected_bytes`), so a ledger from `ledger.recording()` can be held against it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch.distributed as dist

from seqpar.algorithms import allgather, burst, double_ring, local, ring, ulysses, usp, wallfacer
from seqpar.algorithms.base import AlgorithmSpec, Attention, AttnShape, group_context
from seqpar.algorithms.layouts import LAYOUTS, check_layout
from seqpar.algorithms.ledger import Ledger, recording
from seqpar.errors import require

REGISTRY: dict[str, AlgorithmSpec] = {}


def register(spec: AlgorithmSpec) -> AlgorithmSpec:
    REGISTRY[spec.name] = spec
    return spec


for _module in (local, allgather, ulysses, ring, usp, double_ring, wallfacer, burst):
    register(_module.SPEC)


def get(name: str) -> AlgorithmSpec:
    require(name in REGISTRY, "algorithm", name, f"must be one of {', '.join(REGISTRY)}")
    return REGISTRY[name]


def build_attention(
    name: str, *, causal: bool, layout: str = "contiguous",
    group: dist.ProcessGroup | None = None, **options: Any,
) -> Attention:
    """A callable (q, k, v) -> out for this rank's shards; every rank of `group` must build it.

    Raises a SeqparError for an unknown name, layout or option before any communication.
    """
    spec = get(name)
    check_layout(layout)
    resolved = spec.resolve_options(options)
    ctx = group_context(group, causal, layout, resolved)
    if spec.setup is not None:
        spec.setup(ctx)
    return Attention(spec, ctx)


def check(name: str, shape: AttnShape, world: int, layout: str = "contiguous",
          causal: bool = True, **options: Any) -> None:
    """Every rule of `name` for this configuration, without any process group."""
    check_layout(layout)
    get(name).check(shape, world, layout, causal, options)


def expected_bytes(name: str, shape: AttnShape, world: int, **options: Any) -> dict[str, int]:
    """Analytic bytes one rank sends per call, by phase ('forward', 'backward')."""
    spec = get(name)
    return spec.expected_bytes(shape, world, spec.resolve_options(options))


def options_of(name: str) -> Mapping[str, Any]:
    """The options an algorithm takes, with their defaults."""
    return get(name).resolve_options({})


__all__ = ["LAYOUTS", "REGISTRY", "AlgorithmSpec", "Attention", "AttnShape", "Ledger",
           "build_attention", "check", "expected_bytes", "get", "options_of", "recording",
           "register"]
