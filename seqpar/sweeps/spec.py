"""A sweep file (YAML) -> a plan of validated trials. Bad input stops here, before any actor starts.

    name: quickstart                 # optional: default the study's name, else the file's stem
    study: throughput                # optional: start from the study's base and grid
    preset: cpu                      # the study's preset: cpu | gpu-cluster
    base:  {model: tiny, plan: {world: 4}, workload: {causal: true}}
    grid:  {plan: [{algorithm: ring}, {algorithm: ulysses}], workload.seq_len: [1024, 2048]}

The file's base merges over the study's base and its grid axes replace the study's axes of the same
name; `--set key=value` wins over both. Points that break a rule are skipped with their reason
(`--strict`: the first one fails the whole sweep); a sweep with no valid point is an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from seqpar.errors import ConfigError, require
from seqpar.experiments.grid import Point, apply, describe, expand
from seqpar.experiments.registry import PRESET_NAMES, STUDIES
from seqpar.experiments.spec import config_error


class SweepFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: str | None = None
    study: str | None = None
    preset: str = "cpu"
    description: str = ""
    base: dict[str, Any] = {}
    grid: dict[str, Any] = {}


@dataclass
class SweepPlan:
    name: str
    experiment: str                   # the MLflow experiment: the study, else the sweep's name
    headline: str                     # metric `compare` ranks by
    points: list[Point]
    description: str = ""
    study: str | None = None
    preset: str = "cpu"
    source: str = ""
    sets: dict[str, Any] = field(default_factory=dict)

    @property
    def trials(self) -> list[Point]:
        return [p for p in self.points if p.spec is not None]

    @property
    def skipped(self) -> list[Point]:
        return [p for p in self.points if p.spec is None]

    def check(self, strict: bool = False) -> None:
        """Raise for the first invalid point (strict), or when no point is valid."""
        bad = self.skipped
        if bad and (strict or not self.trials):
            i = self.points.index(bad[0])
            why = "--strict" if strict and self.trials else "no point of the sweep is valid"
            err = bad[0].error
            assert err is not None
            raise ConfigError(err.field, err.value,
                              f"{err.rule} (point {i + 1}: {describe(bad[0].overrides)}; {why})")


def parse_sets(items: list[str]) -> dict[str, Any]:
    """`key=value` pairs; the value is read as YAML (4 -> int, true -> bool, [1, 2] -> list)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        require(bool(sep) and bool(key.strip()), "--set", item, "must look like key=value")
        try:
            out[key.strip()] = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            out[key.strip()] = raw
    return out


def build(sweep: SweepFile, source: str = "", sets: dict[str, Any] | None = None) -> SweepPlan:
    base: dict[str, Any] = {}
    grid: dict[str, Any] = {}
    headline = "tokens_per_s"
    if sweep.study is not None:
        require(sweep.study in STUDIES, "study", sweep.study, f"must be one of {', '.join(STUDIES)}")
        require(sweep.preset in PRESET_NAMES, "preset", sweep.preset,
                f"must be one of {', '.join(PRESET_NAMES)}")
        study = STUDIES[sweep.study]
        base, grid = study.sweep(sweep.preset)
        headline = study.headline
    base = apply(base, sweep.base)
    grid = {**grid, **sweep.grid}
    name = sweep.name or sweep.study or (Path(source).stem if source else "sweep")
    return SweepPlan(name=name, experiment=sweep.study or name, headline=headline,
                     points=expand(base, grid, sets), description=sweep.description,
                     study=sweep.study, preset=sweep.preset, source=source, sets=dict(sets or {}))


def parse(data: Any, source: str = "", sets: dict[str, Any] | None = None) -> SweepPlan:
    """A sweep from already-loaded data (a dict)."""
    require(isinstance(data, dict), "file", source or data,
            "must be a YAML mapping with base, grid (and optionally name, study, preset)")
    try:
        sweep = SweepFile.model_validate(data)
    except ValidationError as err:
        raise config_error(err) from None
    return build(sweep, source, sets)


def load(path: str | Path, sets: dict[str, Any] | None = None) -> SweepPlan:
    """Read and expand a sweep file; every problem is one ConfigError naming the field."""
    p = Path(path)
    require(p.is_file(), "file", str(path), "does not exist (or is not a file)")
    try:
        data = yaml.safe_load(p.read_bytes().decode("utf-8"))
    except OSError as err:
        raise ConfigError("file", str(path), f"cannot be read ({err.strerror or err})") from None
    except UnicodeDecodeError as err:
        raise ConfigError("file", str(path), f"is not UTF-8 text (byte 0x{err.object[err.start]:02x} "
                                             f"at offset {err.start})") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "?"
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError("file", str(path), f"malformed YAML at {where}: {problem}") from None
    return parse(data, str(path), sets)


def from_study(name: str, preset: str = "cpu", sets: dict[str, Any] | None = None) -> SweepPlan:
    """`seqpar run <study>`: the study's own sweep."""
    require(name in STUDIES, "study", name, f"must be one of {', '.join(STUDIES)}")
    return parse({"study": name, "preset": preset}, f"study:{name}", sets)
