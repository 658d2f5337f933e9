"""Run a sweep's trials on Ray and log each one to MLflow the moment it ends.

    outcome = run_sweep(plan, tracker=Tracker(), runner=TrialRunner(), retries=1)
    outcome.sweep_id      # the parent run; `seqpar sweep FILE --resume <id>` continues it

Trials are run grouped by world size (stable within a group), so one gang of rank actors serves
every trial of its size instead of being restarted when the grid alternates between sizes.
A trial that FAILED for a reason a fresh gang may not meet again (a rank died, a timeout, start-up)
is retried up to `retries` times; one that FAILED because a rank raised is deterministic and is not.
Only the last attempt is logged (tags seqpar.attempts and seqpar.failure, the kind).
A trial whose step time is unstable (a wide interval or a busy host, `workers.stability`) carries the
reason in the tag seqpar.unstable; with `rerun_unstable` N it is measured again up to N more times
until one round is stable, and the stable round (else the one with the narrowest interval) is logged
with tag seqpar.rounds.
Resume skips the trials whose spec hash already FINISHED in that sweep, so nothing is logged twice;
a trial it re-runs replaces that trial's earlier unfinished runs (soft-deleted: `mlflow runs restore`
brings them back), so the sweep holds one run per trial.
Ctrl-C marks the sweep KILLED and leaves it resumable.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape

from seqpar.errors import ConfigError
from seqpar.experiments.grid import Point
from seqpar.sweeps.progress import SweepProgress
from seqpar.sweeps.spec import SweepPlan

if TYPE_CHECKING:
    from seqpar.platform.tracking import Tracker
    from seqpar.workers.trial import TrialResult, TrialRunner


@dataclass
class TrialOutcome:
    point: Point
    result: TrialResult
    run_id: str
    attempts: int


@dataclass
class SweepOutcome:
    sweep_id: str
    experiment: str
    trials: list[TrialOutcome] = field(default_factory=list)
    resumed: int = 0                   # trials skipped because they already FINISHED

    @property
    def failed(self) -> list[TrialOutcome]:
        return [t for t in self.trials if t.result.status != "FINISHED"]


def _sweep_params(plan: SweepPlan) -> dict[str, Any]:
    return {"sweep.name": plan.name, "sweep.study": plan.study or "", "sweep.preset": plan.preset,
            "sweep.source": plan.source, "sweep.points": len(plan.points),
            "sweep.trials": len(plan.trials), "sweep.skipped": len(plan.skipped),
            **{f"sweep.set.{k}": v for k, v in plan.sets.items()}}


def _plan_record(plan: SweepPlan) -> dict[str, Any]:
    return {"name": plan.name, "description": plan.description,
            "trials": [{"hash": p.spec.hash, "label": p.label} for p in plan.trials if p.spec],
            "skipped": [{"point": p.label, "reason": str(p.error)} for p in plan.skipped]}


def _start(plan: SweepPlan, tracker: Tracker, resume: str | None) -> tuple[str, set[str]]:
    if resume is None:
        sweep_id = tracker.start_sweep(plan.experiment, plan.name, _sweep_params(plan), {
            "seqpar.sweep": plan.name, "seqpar.study": plan.study or "",
            "seqpar.headline": plan.headline})
        tracker.log_dict(sweep_id, _plan_record(plan), "plan.json")
        _log_sweep_file(tracker, sweep_id, plan)
        return sweep_id, set()
    record = tracker.sweep(resume)
    experiment = tracker.experiment_name(record)
    if experiment != plan.experiment:
        raise ConfigError("resume", resume, f"belongs to experiment {experiment!r}, "
                                            f"this sweep logs to {plan.experiment!r}")
    done = tracker.finished_hashes(resume)
    tracker.reopen_sweep(resume)
    return resume, done


def _unfinished(tracker: Tracker, sweep_id: str | None) -> dict[str, list[str]]:
    """Run ids of the sweep's FAILED / KILLED trials, by spec hash (what a resume re-runs)."""
    from seqpar.platform.tracking import HASH_TAG

    if sweep_id is None:
        return {}
    out: dict[str, list[str]] = {}
    for run in tracker.trials(sweep_id):
        if run.status != "FINISHED" and HASH_TAG in run.tags:
            out.setdefault(run.tags[HASH_TAG], []).append(run.run_id)
    return out


def _log_sweep_file(tracker: Tracker, sweep_id: str, plan: SweepPlan) -> None:
    """The sweep file itself on the parent run (a study: its name, preset and --set values)."""
    from pathlib import Path

    if plan.source and Path(plan.source).is_file():
        tracker.log_artifact(sweep_id, plan.source, "sweep")
    else:
        import yaml

        tracker.log_text(sweep_id, yaml.safe_dump({"study": plan.study, "preset": plan.preset,
                                                   "set": plan.sets}), "sweep/sweep.yaml")


def run_one(point: Point, runner: TrialRunner, retries: int,
            gang_id: str) -> tuple[TrialResult, int]:
    """A trial, retried while it FAILS retryably (see FailureKind); returns the last result and
    the attempts it took."""
    spec = point.spec
    assert spec is not None
    attempt = 0
    while True:
        attempt += 1
        result = runner.run(spec.to_case(), nodes=spec.plan.nodes,
                            ranks_per_node=spec.plan.ranks_per_node,
                            link_emulation=spec.env.link_models(), timeout_s=spec.env.timeout_s,
                            experiment_id=gang_id, env_vars=dict(spec.env.vars))
        if result.ok or attempt > retries or not (result.failure and result.failure.retryable):
            return result, attempt


def run_until_stable(point: Point, runner: TrialRunner, retries: int, gang_id: str,
                     rerun_unstable: int) -> tuple[TrialResult, int, int]:
    """`run_one`, again while the result is unstable, at most `rerun_unstable` more rounds: the
    first stable round, else the narrowest interval; returns it, its attempts and the rounds run."""
    from seqpar.workers.stability import half_width

    best: tuple[TrialResult, int] | None = None
    for rounds in range(1, rerun_unstable + 2):
        result, attempts = run_one(point, runner, retries, gang_id)
        if not result.ok or result.unstable is None:
            return result, attempts, rounds
        width = half_width(result.metrics()) or 0.0
        if best is None or width < (half_width(best[0].metrics()) or 0.0):
            best = (result, attempts)
    assert best is not None
    return best[0], best[1], rounds


def log_one(tracker: Tracker, sweep_id: str, plan: SweepPlan, point: Point, result: TrialResult,
            attempts: int, rounds: int = 1) -> str:
    spec = point.spec
    assert spec is not None
    tags = {"seqpar.device": result.device, "seqpar.attempts": str(attempts),
            "seqpar.sweep": plan.name, "seqpar.study": plan.study or "",
            "seqpar.topology": getattr(result, "topology", ""), "seqpar.label": spec.label(),
            "seqpar.algorithm": spec.plan.algorithm}
    if result.failure is not None:
        tags["seqpar.failure"] = result.failure.value
    if result.ok and (reason := result.unstable) is not None:
        tags["seqpar.unstable"] = reason
    if rounds > 1:
        tags["seqpar.rounds"] = str(rounds)
    # each timed iteration's step time on the slowest rank, drawn by MLflow as a curve
    metrics = result.metrics()
    analytic = _analytic_bytes(spec)
    if metrics and analytic is not None:
        metrics["bytes_analytic_per_rank"] = analytic
    series = ({"iter_step_ms": [max(v) for v in zip(*(m.step_ms for m in result.per_rank),
                                                     strict=True)]}
              if result.ok and result.per_rank else None)
    if series is not None and result.per_rank[0].extra.get("losses"):
        series["loss"] = list(result.per_rank[0].extra["losses"])  # a training trial's curve
    return tracker.log_trial(sweep_id, name=spec.label(), spec_hash=spec.hash, params=spec.flat(),
                             metrics=metrics, tags=tags, status=result.status,
                             cause=result.cause, detail=result.to_dict(), series=series,
                             start_time_ms=int((time.time() - result.setup_s - result.run_s) * 1e3))


def _analytic_bytes(spec: Any) -> float | None:
    """The algorithm's analytic bytes one rank sends per step (report: measured vs analytic)."""
    try:
        from seqpar import algorithms

        w = spec.workload  # the call's mask: with documents or a window the rings skip
        by_phase = algorithms.expected_bytes(spec.plan.algorithm, spec.shape, spec.plan.world,
                                             layout=spec.plan.layout, causal=w.causal,
                                             cu_seqlens=w.cu_seqlens, window=w.window,
                                             **spec.options)
        backward = spec.workload.mode != "fwd"  # fwd+bwd and accuracy run backward
        return float(by_phase["forward"] + (by_phase["backward"] if backward else 0))
    except NotImplementedError:  # an algorithm without a formula: no bar
        return None


def _line(result: TrialResult, label: str, attempts: int) -> str:
    if result.status != "FINISHED":
        return (f"[red]✗[/red] {escape(label)}  FAILED after {attempts} attempt(s): "
                f"{escape(str(result.cause))}")
    m = result.metrics()
    line = (f"[green]✓[/green] {escape(label)}  step {m['step_ms']:.1f} ms "
            f"[{m['step_ms_ci_low']:.1f}, {m['step_ms_ci_high']:.1f}]  "
            f"{m['tokens_per_s']:,.0f} tok/s  peak {m['peak_mem_bytes'] / 2**20:.1f} MiB")
    reason = result.unstable
    return line + (f"  [yellow]unstable[/yellow]: {escape(reason)}" if reason else "")


def run_sweep(plan: SweepPlan, *, tracker: Tracker, runner: TrialRunner, retries: int = 0,
              resume: str | None = None, progress: bool = True,
              on_trial_end: Callable[[TrialOutcome], None] | None = None,
              rerun_unstable: int = 0, console: Console | None = None) -> SweepOutcome:
    """Run every trial of `plan` not yet FINISHED in the sweep; see the module docstring. Progress
    and a line per trial go to `console` (the CLI's; default a console on stderr)."""
    if console is None:  # a pipe or a CI log: one line per trial, not rich's 80-column wrap
        console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)
    sweep_id, done = _start(plan, tracker, resume)
    stale = _unfinished(tracker, resume)
    outcome = SweepOutcome(sweep_id, plan.experiment)
    todo = [p for p in plan.trials if p.spec is not None and p.spec.hash not in done]
    outcome.resumed = len(plan.trials) - len(todo)
    todo.sort(key=lambda p: p.spec.plan.world if p.spec else 0)  # stable: one gang per size
    gang_id = f"sweep-{sweep_id[:8]}"
    live = SweepProgress(console, [p.spec for p in todo], gang_id, enabled=progress)
    try:
        with live:
            for point in todo:
                label = point.label
                live.start_trial(point.spec, label)
                t0 = time.monotonic()
                result, attempts, rounds = run_until_stable(point, runner, retries, gang_id,
                                                            rerun_unstable)
                run_id = log_one(tracker, sweep_id, plan, point, result, attempts, rounds)
                live.end_trial(time.monotonic() - t0, unstable=bool(result.ok and result.unstable))
                for old in stale.pop(point.spec.hash if point.spec else "", []):
                    tracker.delete_run(old)  # this trial's run is now `run_id`
                trial = TrialOutcome(point, result, run_id, attempts)
                outcome.trials.append(trial)
                console.print(_line(result, label, attempts), highlight=False)
                if on_trial_end is not None:
                    on_trial_end(trial)
    except BaseException:
        tracker.end_sweep(sweep_id, "KILLED", interrupted="true")
        raise
    _finish(tracker, sweep_id, outcome, console)
    return outcome


def _finish(tracker: Tracker, sweep_id: str, outcome: SweepOutcome, console: Console) -> None:
    from seqpar.sweeps import report

    try:
        report.log_summary(tracker, sweep_id)
    except Exception as err:  # a plot must never cost the sweep its results
        console.print(f"[yellow]plots skipped:[/yellow] {type(err).__name__}: {escape(str(err))}")
    tracker.end_sweep(sweep_id, "FINISHED", failed=str(len(outcome.failed)))
