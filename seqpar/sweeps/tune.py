"""Profile-and-pick auto-tuning (WallFacer §4.4, Eq. 11): every valid configuration of a world
size, a few iterations each, ranked by throughput — arg max tokens/s over the tuning space.

The space is every registered algorithm x its tuning space x layout. Each algorithm's typed options
enumerate their own space at a world size (`Options.space`, through `algorithms.option_space`), so
nothing here knows an algorithm's options; points that break an algorithm's rules are skipped with
the reason the algorithm gives.
"""

from __future__ import annotations

from typing import Any

from seqpar import algorithms
from seqpar.algorithms.layouts import LAYOUTS
from seqpar.errors import ConfigError, require
from seqpar.experiments.grid import Point, expand
from seqpar.planner import clusters
from seqpar.planner.api import predict_spec
from seqpar.rules.options import divisors
from seqpar.rules.shape import SHAPE_PRESETS
from seqpar.sweeps.spec import SweepPlan

__all__ = ["divisors", "option_space", "pruned", "tuning_plan"]


def option_space(name: str, world: int) -> list[dict[str, Any]]:
    """Every combination of the algorithm's tunable options at this world size."""
    return algorithms.option_space(name, world)


def tuning_plan(world: int, model: str, seq_len: int, nodes: int = 1, *, causal: bool = True,
                iters: int = 2, device: str = "cpu", layouts: tuple[str, ...] = LAYOUTS,
                prune: int | None = None, cluster: str = "local",
                dtype: str = "float32") -> SweepPlan:
    """The tuning space as a sweep (experiment 'tune'); `prune` keeps the K points the performance
    model (planner) ranks fastest on `cluster` and skips the rest with their prediction as
    the reason."""
    require(prune is None or prune >= 1, "prune", prune, "must be at least 1")
    require(world >= 1, "world", world, "must be at least 1")
    require(model in SHAPE_PRESETS, "model", model, f"must be one of {', '.join(SHAPE_PRESETS)}")
    base = {"model": model, "plan": {"world": world, "nodes": nodes},
            "workload": {"seq_len": seq_len, "causal": causal, "warmup": 1, "iters": iters,
                         "dtype": dtype},
            "env": {"device": device}}
    plans = []
    for name in algorithms.REGISTRY:
        if (name == "local") != (world == 1):
            continue  # local is the one-rank configuration, and only that
        for opts in option_space(name, world):
            plans.append({"algorithm": name, "options": opts})
    points: list[Point] = expand(base, {"plan": plans, "plan.layout": list(layouts)})
    if prune is not None:
        points = pruned(points, prune, cluster)
    return SweepPlan(name=f"tune {model} P={world} nodes={nodes} N={seq_len}", experiment="tune",
                     headline="tokens_per_s", points=points, source="seqpar tune")


def predicted_ms(points: list[Point], cluster: str) -> dict[int, float]:
    """id(point) -> the performance model's attention time (fwd [+ bwd]) on `cluster`, valid points."""
    c = clusters.load(cluster)
    return {id(p): predict_spec(p.spec, c).attention_ms for p in points if p.spec is not None}


def pruned(points: list[Point], keep: int, cluster: str) -> list[Point]:
    """Valid points beyond the `keep` fastest by the performance model become skipped, with the
    reason."""
    times = predicted_ms(points, cluster)
    valid = [p for p in points if p.spec is not None]
    ranked = sorted(valid, key=lambda p: times[id(p)])
    rank = {id(p): i + 1 for i, p in enumerate(ranked)}
    out = []
    for p in points:
        if p.spec is None or rank[id(p)] <= keep:
            out.append(p)
            continue
        why = (f"pruned by the performance model: predicted {times[id(p)]:.3g} ms on {cluster}, "
               f"rank {rank[id(p)]} of {len(valid)} (--prune {keep})")
        out.append(Point(p.overrides, None, ConfigError("costmodel", p.spec.label(), why)))
    return out
