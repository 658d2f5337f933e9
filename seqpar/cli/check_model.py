"""`seqpar check --model FILE`: a user's model (a config.json, a YAML of ModelConfig's fields or a
preset name), shrunk to its family's tiny model (`check_model.tiny_of`), trained by every algorithm
in every layout on P local ranks — a fixed-length step, and steps of variable-length sequences under
the static and the dynamic SP policy — against the one-process model in float64, every rank's bytes
against the analytic count over the layers. The command parses, calls `seqpar.workers.checking`
and prints; bad input is one line before any rank starts."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

from seqpar.cli.display import display_table, err_console
from seqpar.errors import ConfigError, require
from seqpar.experiments import steps
from seqpar.model import ModelConfig
from seqpar.workers import checking
from seqpar.workers.measure import check_model as checker

POLICIES = ("static", "dynamic")
CAPACITY = 6  # tokens a rank: sequences up to 6 x P need groups of every size
HOW = ("each rank's loss and every gradient against the one-process model in float64; bytes "
       "against the analytic count summed over the layers, each layer's window its own")


def seq_len(world: int) -> int:
    """About 24 tokens, a multiple of 2P (zigzag deals 2P chunks): a shard of 6 at P = 4, longer
    than the tiny model's window of 5, so a sliding layer's ring skips transfers."""
    return 2 * world * max(2, -(-12 // world))


def check_model(model: str, names: Sequence[str], layouts: Sequence[str], world: int,
                device: str | None, seed: int | None, as_json: bool
                ) -> tuple[list[checker.ModelCheck], int]:
    """Plan, run and print the checks of `model`'s tiny model; (results, cases skipped)."""
    require(world >= 2, "world", world, "must be at least 2 with --model (one rank splits nothing)")
    cfg = ModelConfig.load(model)  # a bad file or field: one line here
    tiny = checker.tiny_of(cfg, world)
    seed = seed if seed is not None else secrets.randbelow(2**31)
    names = [n for n in names if n != "local"]
    require(bool(names), "algorithms", "local", "runs on one rank: name an SP algorithm")
    fixed, skipped = _fixed(tiny, names, layouts, world, seed, model)
    taken = list(dict.fromkeys(c.layout for c in fixed)) or list(layouts)
    stepped, skipped_steps = _steps(tiny, names, taken, world, seed)
    skipped += skipped_steps
    require(bool(fixed or stepped), "model", model,
            "no case fits: " + "; ".join(dict.fromkeys(why for *_, why in skipped)))
    results = checking.check_models(fixed, stepped, world, device, say=err_console.print)
    rows = [_row(r) for r in results]
    rows += _skipped_rows(skipped)
    display_table(f"seqpar check --model {model}: its family's tiny model ({checker.shape_line(tiny)}),"
                  f" P={world}, N={seq_len(world)} fixed, steps of up to {CAPACITY * world} tokens "
                  "a sequence, float64",
                  ["step", "algorithm", "layout", "loss err", "max rel grad err",
                   "bytes, busiest rank (fixed: fwd/bwd)", "status"], rows, as_json=as_json)
    return results, len(skipped)


def _options(name: str, world: int) -> dict[str, Any]:
    form = checking.CHECK_FORMS.get(name)
    return form(world) if form else {}


def _fixed(tiny: ModelConfig, names: Sequence[str], layouts: Sequence[str], world: int,
           seed: int, model: str) -> tuple[list[checker.ModelCase], list[tuple[str, ...]]]:
    cases, skipped = [], []
    for name in names:
        for layout in layouts:
            case = checker.ModelCase(tiny, name, world, layout,
                                     tuple(sorted(_options(name, world).items())),
                                     seq_len=seq_len(world), seed=seed, name=model)
            try:
                case.validate()  # the model's rules and the algorithm's: before any rank starts
            except ConfigError as err:
                skipped.append(("fixed", name, layout, str(err)))
                continue
            cases.append(case)
    return cases, skipped


def _steps(tiny: ModelConfig, names: Sequence[str], layouts: Sequence[str], world: int,
           seed: int) -> tuple[list[Any], list[tuple[str, ...]]]:
    """Each algorithm's step under each policy, the layouts taken in turn."""
    overrides = checker.overrides_of(tiny, ModelConfig.load("tiny"))
    cases, skipped = [], []
    for i, name in enumerate(names):
        for j, policy in enumerate(POLICIES):
            layout = layouts[(i + j) % len(layouts)]
            try:
                case = steps.make_case(
                    name, world, f"lognormal:mean=9,sigma=1.0,min=2,max={CAPACITY * world}",
                    tokens=20 * world, capacity=CAPACITY, policy=policy, seed=seed % 1000,
                    layout=layout, options=_options(name, world), overrides=overrides,
                    longest=CAPACITY * world)
                checker.validate_step(case)
            except ConfigError as err:
                skipped.append((policy, name, layout, str(err)))
                continue
            cases.append(case)
    return cases, skipped


def _skipped_rows(skipped: list[tuple[str, ...]]) -> list[list[Any]]:
    """One row per step kind, layout and reason, naming every algorithm it skipped."""
    grouped: dict[tuple[str, str, str], list[str]] = {}
    for kind, name, layout, why in skipped:
        grouped.setdefault((kind, layout, why), []).append(name)
    return [[kind, ", ".join(names), layout, "-", "-", "-", f"skipped: {why}"]
            for (kind, layout, why), names in grouped.items()]


def _row(r: checker.ModelCheck) -> list[Any]:
    c = r.case
    if isinstance(c, checker.ModelCase):
        kind, name, layout = "fixed", c.algorithm + "".join(f" {k}={v}" for k, v in c.options), c.layout
    else:
        kind, layout = c.sp_policy, c.layout
        name = c.algorithm + "".join(f" {k}={v}" for k, v in c.options)
    measured = "/".join(str(v) for v in r.bytes_measured.values())
    same = r.bytes_measured == r.bytes_expected
    expected = "/".join(str(v) for v in r.bytes_expected.values())
    return [kind, name, layout, f"{r.loss_error:.1e}", f"{r.grad_error:.1e}",
            measured + (" ✓" if same else f" ≠ {expected}"),
            "ok" if r.ok else "FAIL: " + "; ".join(r.failures[:3])]
