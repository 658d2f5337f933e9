"""The sweep's headline: the best finished trial by its metric, overall and per algorithm, in the
metric's direction (`experiments.registry.higher_is_better`)."""

from __future__ import annotations

from seqpar.experiments.registry import higher_is_better
from seqpar.sweeps.report.view import TrialView


def _ranked(runs: list[TrialView], metric: str) -> list[TrialView]:
    return [t for t in runs if t.finished and metric in t.metrics]


def headline_metrics(runs: list[TrialView], metric: str) -> dict[str, float]:
    """The best finished trial's metric (`best.<metric>`) and each algorithm's best
    (`<algorithm>.<metric>`), for the sweep's parent run."""
    ok = _ranked(runs, metric)
    pick = max if higher_is_better(metric) else min
    out: dict[str, float] = {}
    if ok:
        out[f"best.{metric}"] = pick(t.metrics[metric] for t in ok)
    for algo in sorted({t.algorithm for t in ok}):
        out[f"{algo}.{metric}"] = pick(t.metrics[metric] for t in ok if t.algorithm == algo)
    return out


def best_run(runs: list[TrialView], metric: str) -> TrialView | None:
    ok = _ranked(runs, metric)
    if not ok:
        return None
    return (max if higher_is_better(metric) else min)(ok, key=lambda t: t.metrics[metric])
