"""Profile-and-pick auto-tuning (WallFacer §4.4, Eq. 11): every valid configuration of a world
size, a few iterations each, ranked by throughput — arg max tokens/s over the tuning space.

The space is every registered algorithm x its tunable options x layout (x placement). Which options
an algorithm takes comes from the algorithm registry (`options_of`), so an algorithm that lands
later is tuned without edits here; the values tried for an option come from TUNABLE below, and
points that break an algorithm's rules are skipped with the reason the algorithm gives.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from seqpar import algorithms
from seqpar.algorithms.layouts import LAYOUTS
from seqpar.errors import ConfigError, require
from seqpar.experiments.grid import Point, expand
from seqpar.experiments.spec import PRESETS
from seqpar.sweeps.spec import SweepPlan


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# option name -> the values worth trying at world P
TUNABLE: dict[str, Callable[[int], list[Any]]] = {
    "dhp": divisors,
    "inner_ring": divisors,
    "team_size": lambda p: [c for c in divisors(p) if c * c <= p],
}
# placements are named per algorithm (the one list of each lives in algorithms.groups)
PLACEMENTS = {"usp": "PLACEMENTS", "wallfacer": "WALLFACER_PLACEMENTS"}
DERIVED = {"dcp": lambda world, opts: world // opts["dhp"] if "dhp" in opts else None}


def option_space(name: str, world: int) -> list[dict[str, Any]]:
    """Every combination of the algorithm's tunable options at this world size."""
    from seqpar.algorithms import groups

    takes = algorithms.options_of(name)
    axes = {key: TUNABLE[key](world) for key in takes if key in TUNABLE}
    if "placement" in takes:
        axes["placement"] = list(getattr(groups, PLACEMENTS.get(name, ""), [takes["placement"]]))
    combos = [dict(zip(axes, values, strict=True)) for values in itertools.product(*axes.values())]
    for combo in combos:
        for key, derive in DERIVED.items():
            value = derive(world, combo) if key in takes else None
            if value is not None:
                combo[key] = value
    return combos or [{}]


def tuning_plan(world: int, model: str, seq_len: int, nodes: int = 1, *, causal: bool = True,
                iters: int = 2, device: str = "cpu", layouts: tuple[str, ...] = LAYOUTS,
                prune: int | None = None, cluster: str = "local",
                dtype: str = "float32") -> SweepPlan:
    """The tuning space as a sweep (experiment 'tune'); `prune` keeps the K points the performance
    model (experiments.perf) ranks fastest on `cluster` and skips the rest with their prediction as
    the reason."""
    require(prune is None or prune >= 1, "prune", prune, "must be at least 1")
    require(world >= 1, "world", world, "must be at least 1")
    require(model in PRESETS, "model", model, f"must be one of {', '.join(PRESETS)}")
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
    from seqpar.experiments import clusters, perf

    c = clusters.load(cluster)
    return {id(p): perf.predict_spec(p.spec, c).attention_ms for p in points if p.spec is not None}


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
