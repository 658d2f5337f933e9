"""A base spec and a grid of overrides -> the points of a sweep (plain dicts, validated later).

    base = {"model": "tiny", "plan": {"world": 4}, "workload": {"causal": True}}
    grid = {"plan": [{"algorithm": "local", "world": 1}, {"algorithm": "ring"}],   # merged at plan
            "workload.seq_len": [1024, 2048],                                     # a dotted key
            "scale": [{"plan.world": 2, "workload.seq_len": 512}]}                 # a named axis

Each grid key is an axis; the points are the cartesian product of the axes, in file order, the last
axis varying fastest. A key that names a place in the spec (`plan`, `workload.seq_len`) sets that
place; any other key is a named axis whose values are dicts of dotted keys, so several fields can
move together (weak scaling: world and seq_len).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from seqpar.errors import ConfigError, require
from seqpar.experiments.spec import ExperimentSpec

SECTIONS = ("model", "plan", "workload", "env", "train")


def set_path(data: dict[str, Any], path: str, value: Any) -> None:
    """data[a][b][c] = value for path 'a.b.c'; dict values merge into what is there."""
    keys = path.split(".")
    node = data
    for key in keys[:-1]:
        child = node.get(key)
        if isinstance(child, str) and key == "model":
            child = {"preset": child}  # `model: tiny` then `model.kv_heads: 2`
        if not isinstance(child, dict):
            child = {}
        node[key] = child
        node = child
    last = keys[-1]
    if isinstance(value, Mapping) and isinstance(node.get(last), dict):
        for k, v in value.items():
            set_path(node, f"{last}.{k}", v)
    elif isinstance(value, Mapping) and last == "model" and isinstance(node.get(last), str):
        node[last] = {"preset": node[last]}
        set_path(node, last, value)
    else:
        node[last] = copy.deepcopy(dict(value) if isinstance(value, Mapping) else value)


def apply(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of base with each dotted override set (named-axis dicts are spread first)."""
    out = copy.deepcopy(dict(base))
    for key, value in overrides.items():
        if key.split(".")[0] in SECTIONS:
            set_path(out, key, value)
        else:
            require(isinstance(value, Mapping), f"grid.{key}", value,
                    f"a named axis takes dicts of dotted keys (or use one of {', '.join(SECTIONS)})")
            for k, v in value.items():
                require(str(k).split(".")[0] in SECTIONS, f"grid.{key}", k,
                        f"must start with one of {', '.join(SECTIONS)}")
                set_path(out, str(k), v)
    return out


def points(grid: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The cartesian product of the axes as override dicts {axis: value}."""
    axes = []
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"grid.{key}", values, "must be a non-empty list of values")
        axes.append([(key, v) for v in values])
    return [dict(combo) for combo in itertools.product(*axes)] or [{}]


def describe(overrides: Mapping[str, Any]) -> str:
    """A short label for one point: 'plan.algorithm=ring workload.seq_len=1024'."""
    parts = []
    for key, value in overrides.items():
        if isinstance(value, Mapping):
            parts += [f"{k}={v}" for k, v in value.items()]
        else:
            parts.append(f"{key}={value}")
    return " ".join(parts)


# ------------------------------------------------------------------------------ points -> specs
def expand(base: Mapping[str, Any], grid: Mapping[str, Any],
           sets: Mapping[str, Any] | None = None) -> list[Point]:
    """Every point of the grid, validated: a spec, or the reason it cannot run.

    `sets` (dotted key -> value, from `--set`) win over base and grid alike; points that end up
    as the same experiment (same spec hash) are kept once.
    """
    out, seen = [], set()
    for overrides in points(grid):
        data = apply(apply(base, overrides), sets or {})
        try:
            spec = ExperimentSpec.parse(data)
        except ConfigError as err:
            out.append(Point(overrides, None, err))
            continue
        if spec.hash not in seen:
            seen.add(spec.hash)
            out.append(Point(overrides, spec, None))
    return out


@dataclass(frozen=True)
class Point:
    overrides: dict[str, Any]
    spec: ExperimentSpec | None
    error: ConfigError | None

    @property
    def label(self) -> str:
        return self.spec.label() if self.spec is not None else describe(self.overrides)
