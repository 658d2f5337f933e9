"""Run a sweep's trials on Ray and log each one to MLflow the moment it ends.

    outcome = run_sweep(plan, tracker=Tracker(), runner=TrialRunner(), retries=1)
    outcome.sweep_id      # the parent run; `seqpar sweep FILE --resume <id>` continues it
    outcome.views()       # every trial as it was logged: the table, without reading MLflow back

Each spec becomes its trial once (`spec.to_trial(gang_id)`: a `case.Trial`, validated when the
spec was), which goes unchanged to the TrialRunner, the gang and every rank; what comes back is a
TrialResult whose metrics were computed once (`workers.metrics.TrialMetrics`). The runner logs
them as they are, and the sweep's summary (headline, table, figures, page) is made from what it
logged; only the trials a resumed sweep had finished before are read back from the store.

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
Ctrl-C marks the sweep KILLED and leaves it resumable; so does any error, whose line names the
`--resume` id.

Memory stays bounded by what the report needs, whatever the sweep's size: once a trial is logged
the driver keeps its `TrialView` (the numbers and intervals the comparison, the report and the
figures read), not its ranks' records, its run's params or its per_rank.json, except for the few
trials whose per-rank breakdown or timeline the report draws (`plots.detail_candidates`, at most
a dozen). A resumed sweep reads its earlier trials back with one search. What grew besides was
native: glibc's malloc arenas, one a driver thread (`platform.heap.bound_heap`, called before Ray
starts, holds them to two; measured: 0.16 -> 0.04 MiB a trial).

Artifacts (per-rank JSON, figures, the page, the sweep file) that cannot be written cost nothing
else: the first is a warning naming where it was to go and why, the sweep goes on with every trial
FINISHED as measured (its per-rank medians are in the run itself), and the end lists what is missing
(`seqpar report <id>` draws the figures again once the store has room).

While it runs the driver publishes `seqpar_sweep_trials` (done, failed, pending; platform.metrics),
and every trial runs under its name (`metrics.trial_tag`: short label and spec hash), which its
remote calls and every rank series carry.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.markup import escape

from seqpar.errors import ConfigError
from seqpar.experiments.corpora import dataset_inputs
from seqpar.experiments.grid import Point
from seqpar.platform import metrics
from seqpar.platform.tracking import HASH_TAG, RunRecord, Tracker, environment_tags
from seqpar.sweeps import report
from seqpar.sweeps.progress import SweepProgress
from seqpar.sweeps.report.plots import MAX_RANK_PANELS, config_ends, detail_candidates
from seqpar.sweeps.report.view import SweepView, TrialView
from seqpar.sweeps.spec import SweepPlan
from seqpar.workers.trial import TrialResult, TrialRunner


@dataclass
class TrialOutcome:
    """A trial as it ends (what `on_trial_end` sees): its whole result and its run as logged."""

    point: Point
    result: TrialResult
    run: RunRecord     # the run as it was logged
    attempts: int

    @property
    def run_id(self) -> str:
        return self.run.run_id


@dataclass(frozen=True)
class KeptTrial:
    """What the sweep keeps of a trial once it is logged: its view (the report's numbers)."""

    point: Point
    view: TrialView
    attempts: int
    failure: str | None  # the FailureKind's value when it FAILED

    @property
    def run_id(self) -> str:
        return self.view.run_id

    @property
    def status(self) -> str:
        return self.view.status


@dataclass
class SweepOutcome:
    sweep: SweepView
    trials: list[KeptTrial] = field(default_factory=list)
    resumed: int = 0                                        # trials skipped: already FINISHED
    earlier: list[TrialView] = field(default_factory=list)  # theirs, read back once
    kept: dict[str, dict[str, Any]] = field(default_factory=dict)  # run id -> per_rank.json

    @property
    def sweep_id(self) -> str:
        return self.sweep.sweep_id

    @property
    def experiment(self) -> str:
        return self.sweep.experiment

    @property
    def failed(self) -> list[KeptTrial]:
        return [t for t in self.trials if t.status != "FINISHED"]

    def views(self) -> list[TrialView]:
        """Every trial of the sweep: this session's as logged, and a resume's earlier ones."""
        return [t.view for t in self.trials] + self.earlier

    def details(self) -> dict[str, dict[str, Any]]:
        """run id -> per_rank.json of the trials whose breakdown the report draws (in memory)."""
        return dict(self.kept)


class DetailKeeper:
    """The per_rank.json of the trials the report's per-rank figures use (`detail_candidates`:
    at most a dozen), kept as the sweep runs; every other trial's is only in the store."""

    def __init__(self) -> None:
        self.views: list[TrialView] = []
        self.details: dict[str, dict[str, Any]] = {}
        self.seen = 0  # multi-rank trials offered: past MAX_RANK_PANELS only the ends are kept

    def offer(self, view: TrialView, result: TrialResult) -> None:
        if not view.finished or view.world < 2:
            return
        self.seen += 1
        offered = [*self.views, view]
        if self.seen <= MAX_RANK_PANELS:  # every one may be a panel yet
            wanted = {t.run_id for t in offered}
        else:  # each configuration's ends (the report's panels among them) and the timelines'
            wanted = {t.run_id for t in [*config_ends(offered), *detail_candidates(offered)]}
        if view.run_id not in wanted:
            return
        self.views = [t for t in [*self.views, view] if t.run_id in wanted]
        self.details = {k: v for k, v in self.details.items() if k in wanted}
        self.details[view.run_id] = result.to_dict()


def _sweep_params(plan: SweepPlan) -> dict[str, Any]:
    return {"sweep.name": plan.name, "sweep.study": plan.study or "", "sweep.preset": plan.preset,
            "sweep.source": plan.source, "sweep.points": len(plan.points),
            "sweep.trials": len(plan.trials), "sweep.skipped": len(plan.skipped),
            **{f"sweep.set.{k}": v for k, v in plan.sets.items()}}


def _plan_record(plan: SweepPlan) -> dict[str, Any]:
    return {"name": plan.name, "description": plan.description,
            "trials": [{"hash": p.spec.hash, "label": p.label} for p in plan.trials if p.spec],
            "skipped": [{"point": p.label, "reason": str(p.error)} for p in plan.skipped]}


def _start(plan: SweepPlan, tracker: Tracker, resume: str | None
           ) -> tuple[SweepView, list[RunRecord]]:
    """The sweep's parent run (new, or the resumed one) and, on resume, its trial runs."""
    if resume is None:
        tags = {"seqpar.sweep": plan.name, "seqpar.study": plan.study or "",
                "seqpar.headline": plan.headline}
        started = int(time.time() * 1e3)
        sweep_id = tracker.start_sweep(plan.experiment, plan.name, _sweep_params(plan), tags)
        tracker.log_dict(sweep_id, _plan_record(plan), "plan.json")
        _log_sweep_file(tracker, sweep_id, plan)
        return SweepView(sweep_id, plan.name, plan.experiment, started,
                         {**environment_tags(), **tags}, tracker.uri), []
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


def trial_tag(point: Point) -> str:
    """The trial's name in the dashboard and on its series (platform.metrics.trial_tag)."""
    assert point.spec is not None
    return metrics.trial_tag(point.spec.label(), point.spec.hash)


def run_one(point: Point, runner: TrialRunner, retries: int,
            gang_id: str, sweep: str = "") -> tuple[TrialResult, int]:
    """A trial, retried while it FAILS retryably (see FailureKind); returns the last result and
    the attempts it took. `sweep`: the sweep's name (on the rank actors a new gang starts)."""
    assert point.spec is not None
    trial = point.spec.to_trial(gang_id)
    attempt = 0
    while True:
        attempt += 1
        result = runner.run(trial, tag=trial_tag(point), sweep=sweep)
        if result.ok or attempt > retries or not (result.failure and result.failure.retryable):
            return result, attempt


def run_until_stable(point: Point, runner: TrialRunner, retries: int, gang_id: str,
                     rerun_unstable: int, sweep: str = "") -> tuple[TrialResult, int, int]:
    """`run_one`, again while the result is unstable, at most `rerun_unstable` more rounds: the
    first stable round, else the narrowest interval; returns it, its attempts and the rounds run."""
    best: tuple[TrialResult, int] | None = None
    for rounds in range(1, rerun_unstable + 2):
        result, attempts = run_one(point, runner, retries, gang_id, sweep)
        if not result.ok or result.unstable is None:
            return result, attempts, rounds
        width = result.metrics.half_width or 0.0
        if best is None or width < (best[0].metrics.half_width or 0.0):
            best = (result, attempts)
    assert best is not None
    return best[0], best[1], rounds


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


def _line(result: TrialResult, label: str, attempts: int, count: str = "") -> str:
    """The trial's line; `count` (a long sweep's `[12/1000]`) at its end."""
    return _text(result, label, attempts) + (f"  [dim]{count}[/dim]" if count else "")


def _text(result: TrialResult, label: str, attempts: int) -> str:
    if result.status != "FINISHED":
        return (f"[red]✗[/red] {escape(label)}  FAILED after {attempts} attempt(s): "
                f"{escape(str(result.cause))}")
    m = result.metrics
    line = (f"[green]✓[/green] {escape(label)}  step {report.cell('step_ms', m['step_ms'])} ms "
            f"({report.cell('step_ms', m['step_ms_ci_low'])}-"
            f"{report.cell('step_ms', m['step_ms_ci_high'])})  "
            f"{report.cell('tokens_per_s', m['tokens_per_s'])} tok/s  "
            f"peak {report.metric_text('peak_mem_bytes', m['peak_mem_bytes'])}")
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
    artifacts = MissingArtifacts(tracker, console)
    sweep, earlier = _start(plan, tracker, resume)
    artifacts.check()
    done = {r.tags[HASH_TAG] for r in earlier if r.status == "FINISHED" and HASH_TAG in r.tags}
    stale: dict[str, list[str]] = {}  # run ids of FAILED / KILLED trials by hash: a resume reruns
    for r in earlier:
        if r.status != "FINISHED" and HASH_TAG in r.tags:
            stale.setdefault(r.tags[HASH_TAG], []).append(r.run_id)
    outcome = SweepOutcome(sweep, earlier=report.trials(
        r for r in earlier if r.tags.get(HASH_TAG) in done))
    del earlier  # the views are what the report reads
    keeper = DetailKeeper()
    todo = [p for p in plan.trials if p.spec is not None and p.spec.hash not in done]
    outcome.resumed = len(plan.trials) - len(todo)
    todo.sort(key=lambda p: p.spec.plan.world if p.spec else 0)  # stable: one gang per size
    gang_id = f"sweep-{sweep.sweep_id[:8]}"
    console.print(f"sweep id {sweep.sweep_id}: rank actors seqpar:{gang_id}:rank-<r>, "
                  f'metrics tagged sweep="{metrics.sweep_tag(gang_id)}"', highlight=False,
                  soft_wrap=True)
    counts = TrialCounts(metrics.sweep_tag(gang_id), outcome.resumed, len(todo))
    live = SweepProgress(console, [p.spec for p in todo], gang_id, enabled=progress,
                         done=outcome.resumed)
    try:
        with live:
            for point in todo:
                label = point.label
                live.start_trial(point.spec, label)
                t0 = time.monotonic()
                result, attempts, rounds = run_until_stable(point, runner, retries, gang_id,
                                                            rerun_unstable, plan.name)
                run = log_one(tracker, sweep.sweep_id, plan, point, result, attempts, rounds)
                artifacts.check()
                live.end_trial(time.monotonic() - t0, unstable=bool(result.ok and result.unstable))
                for old in stale.pop(point.spec.hash if point.spec else "", []):
                    tracker.delete_run(old)  # this trial's run is now `run`
                trial = TrialOutcome(point, result, run, attempts)
                view = TrialView.of(run)
                keeper.offer(view, result)
                outcome.trials.append(KeptTrial(point, view, attempts, result.failure and
                                                result.failure.value))
                counts.ended(result.ok, live.rate_per_min(), live.eta.remaining_s())
                console.print(_line(result, label, attempts, live.count()), highlight=False)
                if on_trial_end is not None:
                    on_trial_end(trial)
                del trial, result, run  # the ranks' records: only in the store from here
    except BaseException as err:
        counts.close()
        with contextlib.suppress(Exception):  # the store itself may be what failed
            tracker.end_sweep(sweep.sweep_id, "KILLED", interrupted="true")
        if not isinstance(err, KeyboardInterrupt):
            console.print(f"[red]sweep {sweep.sweep_id} stopped[/red] by {type(err).__name__}: "
                          f"{escape(str(err).strip()[:300])}; the trials logged so far stay, "
                          f"continue with --resume {sweep.sweep_id}", highlight=False,
                          soft_wrap=True)
        raise
    counts.close()
    outcome.kept = keeper.details
    _finish(tracker, outcome, console)
    artifacts.check()
    artifacts.summary(sweep.sweep_id)
    return outcome


class TrialCounts:
    """The driver's `seqpar_sweep_trials` (done, failed, pending), published while the sweep
    runs; a sweep outside Ray (no driver to publish from) publishes nothing."""

    def __init__(self, sweep: str, done: int, pending: int):
        self.sweep, self.counts = sweep, {"done": done, "failed": 0, "pending": pending}
        self.publisher = metrics.Publisher() if _ray_up() else None
        self._publish()

    def ended(self, ok: bool, per_min: float | None = None, left_s: float | None = None) -> None:
        """A trial ended; with the sweep's pace (trials a minute) and the time left, when known
        (`seqpar cluster status` shows them)."""
        self.counts["done" if ok else "failed"] += 1
        self.counts["pending"] -= 1
        self._publish()
        if self.publisher is not None:
            for name, value in (("seqpar_sweep_trials_per_min", per_min),
                                ("seqpar_sweep_left_s", left_s)):
                if value is not None:
                    self.publisher.set(name, value, {"sweep": self.sweep})

    def _publish(self) -> None:
        if self.publisher is not None:
            for status, n in self.counts.items():
                self.publisher.set("seqpar_sweep_trials", n,
                                   {"sweep": self.sweep, "status": status})

    def close(self) -> None:
        if self.publisher is not None:
            self.publisher.close()


def _ray_up() -> bool:
    try:
        import ray
    except ImportError:
        return False
    return ray.is_initialized()


class MissingArtifacts:
    """What the sweep says about artifacts that could not be written (`Tracker.missing`): one
    warning, the first time, naming where and why; at the end, the list."""

    def __init__(self, tracker: Tracker, console: Console):
        self.tracker, self.console = tracker, console
        self.first = len(tracker.missing)  # a tracker shared with earlier sweeps: theirs aside
        self.warned = False

    @property
    def missing(self) -> list[Any]:
        return self.tracker.missing[self.first:]

    def check(self) -> None:
        if self.missing and not self.warned:
            self.warned = True
            m = self.missing[0]
            self.console.print(
                f"[yellow]warning:[/yellow] artifact {escape(m.where)} not written: "
                f"{escape(m.error)}; measurements still go to the store, missing artifacts are "
                "listed at the end", highlight=False, soft_wrap=True)

    def summary(self, sweep_id: str) -> None:
        missing = self.missing
        if not missing:
            return
        per_rank = sum(m.path == "per_rank.json" for m in missing)
        others = sorted({m.path for m in missing if m.path != "per_rank.json"})
        parts = ([f"per_rank.json of {per_rank} trial(s) (their per-rank medians are in the "
                  "runs: rank_step_ms, rank_flops)"] if per_rank else []) + others
        self.console.print(
            f"[yellow]{len(missing)} artifact(s) missing[/yellow] ({escape(missing[-1].error)}): "
            f"{escape(', '.join(parts))}; once the artifact store has room, "
            f"`seqpar report {sweep_id}` draws the figures and the page again", highlight=False,
            soft_wrap=True)


def _finish(tracker: Tracker, outcome: SweepOutcome, console: Console) -> None:
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
