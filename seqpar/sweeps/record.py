"""A sweep in the tracking store: its parent run, started (with its params, plan and sweep file)
or resumed (`start`: refused in one line when it logs to another experiment), each trial as one
run (`log_one`), the summary logged on the parent run at the end (`finish`), and `nothing_left`,
the check that a resumed sweep has nothing to run.

Resume skips the trials whose spec hash already FINISHED in that sweep, so nothing is logged twice;
a trial it re-runs replaces that trial's earlier unfinished runs (soft-deleted: `mlflow runs
restore` brings them back), so the sweep holds one run per trial.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.markup import escape

from seqpar.errors import ConfigError
from seqpar.experiments.corpora import dataset_inputs
from seqpar.experiments.grid import Point
from seqpar.platform.run_entities import environment_tags
from seqpar.platform.tracking import HASH_TAG, RunRecord, Tracker
from seqpar.sweeps import report
from seqpar.sweeps.outcome import SweepOutcome
from seqpar.sweeps.report.plots import detail_candidates
from seqpar.sweeps.report.view import SweepView, TrialView
from seqpar.sweeps.spec import SweepPlan
from seqpar.workers.trial import TrialResult


def _sweep_params(plan: SweepPlan) -> dict[str, Any]:
    return {"sweep.name": plan.name, "sweep.study": plan.study or "", "sweep.preset": plan.preset,
            "sweep.source": plan.source, "sweep.points": len(plan.points),
            "sweep.trials": len(plan.trials), "sweep.skipped": len(plan.skipped),
            **{f"sweep.set.{k}": v for k, v in plan.sets.items()}}


def _plan_record(plan: SweepPlan) -> dict[str, Any]:
    return {"name": plan.name, "description": plan.description,
            "trials": [{"hash": p.spec.hash, "label": p.label} for p in plan.trials if p.spec],
            "skipped": [{"point": p.label, "reason": str(p.error)} for p in plan.skipped]}


def start(plan: SweepPlan, tracker: Tracker, resume: str | None
           ) -> tuple[SweepView, list[RunRecord]]:
    """The sweep's parent run (new, or the resumed one) and, on resume, its trial runs."""
    if resume is None:
        tags = {"seqpar.sweep": plan.name, "seqpar.study": plan.study or "",
                "seqpar.headline": plan.headline}
        started = int(time.time() * 1e3)
        params = _sweep_params(plan)
        sweep_id = tracker.start_sweep(plan.experiment, plan.name, params, tags)
        tracker.log_dict(sweep_id, _plan_record(plan), "plan.json")
        _log_sweep_file(tracker, sweep_id, plan)
        return SweepView(sweep_id, plan.name, plan.experiment, started,
                         {**environment_tags(), **tags}, tracker.uri,
                         {k: str(v) for k, v in params.items()}), []  # as the store keeps them
    sweep = _resumed(plan, tracker, resume)
    earlier = tracker.trials(resume)
    tracker.reopen_sweep(resume)
    return sweep, earlier


def _resumed(plan: SweepPlan, tracker: Tracker, resume: str) -> SweepView:
    """The sweep `resume` names, refused in one line when it logs to another experiment."""
    sweep = SweepView.read(tracker, resume, "resume")
    if sweep.experiment != plan.experiment:
        raise ConfigError("resume", resume, f"belongs to experiment {sweep.experiment!r}, "
                                            f"this sweep logs to {plan.experiment!r}")
    return sweep


def nothing_left(plan: SweepPlan, tracker: Tracker, resume: str) -> list[TrialView] | None:
    """A resumed sweep that FINISHED with every trial of `plan` FINISHED: its trials' views (one
    search; the CLI then says so without starting Ray); None when something is left to run."""
    _resumed(plan, tracker, resume)
    if tracker.sweep(resume).status != "FINISHED":
        return None
    runs = [r for r in tracker.trials(resume) if r.status == "FINISHED" and HASH_TAG in r.tags]
    done = {r.tags[HASH_TAG] for r in runs}
    if any(p.spec is not None and p.spec.hash not in done for p in plan.trials):
        return None
    return report.trials(runs)


def _log_sweep_file(tracker: Tracker, sweep_id: str, plan: SweepPlan) -> None:
    """The sweep file itself on the parent run (a study: its name, preset and --set values)."""
    if plan.source and Path(plan.source).is_file():
        tracker.log_artifact(sweep_id, plan.source, "sweep")
    else:
        tracker.log_text(sweep_id, yaml.safe_dump({"study": plan.study, "preset": plan.preset,
                                                   "set": plan.sets}), "sweep/sweep.yaml")


def log_one(tracker: Tracker, sweep_id: str, plan: SweepPlan, point: Point, result: TrialResult,
            attempts: int, rounds: int = 1) -> RunRecord:
    """The trial as one MLflow run: the flattened spec, the metrics as computed, the per-iteration
    series, and tags (the kernel and GEMM dtype the ranks ran, why it failed or is unstable)."""
    spec = point.spec
    assert spec is not None
    m = result.metrics
    tags = {"seqpar.device": result.device, "seqpar.attempts": str(attempts),
            "seqpar.sweep": plan.name, "seqpar.study": plan.study or "",
            "seqpar.topology": result.topology, "seqpar.label": spec.label(),
            "seqpar.algorithm": spec.plan.algorithm}
    params: dict[str, Any] = spec.flat()
    if m.kernel:
        tags["seqpar.kernel"] = params["trial.kernel"] = m.kernel
        tags["seqpar.gemm_dtype"] = params["trial.gemm_dtype"] = m.gemm_dtype
    if result.failure is not None:
        tags["seqpar.failure"] = result.failure.value
    if result.ok and m.unstable is not None:
        tags["seqpar.unstable"] = m.unstable
    if rounds > 1:
        tags["seqpar.rounds"] = str(rounds)
    by_rank = None
    if result.ok and len(result.per_rank) > 1:  # the per-rank breakdown, beside the artifact
        by_rank = {"rank_step_ms": [r.median_step_ms() for r in result.per_rank],
                   "rank_flops": [float(sum(r.flops.values())) for r in result.per_rank]}
    record = tracker.log_trial(sweep_id, name=spec.label(), spec_hash=spec.hash, params=params,
                               metrics=m, tags=tags, status=result.status,
                               cause=result.cause, detail=result.to_dict(),
                               series=m.series if result.ok else None, by_rank=by_rank,
                               start_time_ms=int((time.time() - result.setup_s - result.run_s)
                                                 * 1e3))
    tracker.log_datasets(record.run_id, dataset_inputs(spec.workload))  # the corpus it read
    return record


def finish(tracker: Tracker, outcome: SweepOutcome, console: Console) -> None:
    """The summary on the parent run (a plot that fails costs the sweep nothing else), and the
    sweep ended FINISHED with its count of failed trials."""
    details = outcome.details()
    try:
        views = outcome.views()
        if outcome.earlier:  # a resumed sweep's earlier trials: the wanted details from the store
            earlier = {t.run_id for t in outcome.earlier}
            details.update(report.per_rank_details(
                tracker, [t for t in detail_candidates(views) if t.run_id in earlier]))
        report.log_summary(tracker, outcome.sweep, views, details)
    except Exception as err:  # a plot must never cost the sweep its results
        console.print(f"[yellow]plots skipped:[/yellow] {type(err).__name__}: {escape(str(err))}")
    tracker.end_sweep(outcome.sweep_id, "FINISHED", failed=str(len(outcome.failed)))
