"""Run a sweep's trials on Ray and log each one to MLflow the moment it ends.

    outcome = run_sweep(plan, tracker=Tracker(), runner=TrialRunner(), retries=1)
    outcome.sweep_id      # the parent run; `seqpar sweep FILE --resume <id>` continues it
    outcome.views()       # every trial as it was logged: the table, without reading MLflow back

Each spec becomes its trial once (`spec.to_trial(gang_id)`: a `case.Trial`, validated when the
spec was), which goes unchanged to the TrialRunner, the gang and every rank; what comes back is a
TrialResult whose metrics were computed once (`workers.metrics.TrialMetrics`). The runner logs
them as they are (`record`), and the sweep's summary (headline, table, figures, page) is made from
what it logged; only the trials a resumed sweep had finished before are read back from the store.

Trials are run grouped by world size (stable within a group), so one gang of rank actors serves
every trial of its size instead of being restarted when the grid alternates between sizes.
A trial that FAILED for a reason a fresh gang may not meet again (a rank died, a timeout, start-up)
is retried up to `retries` times; one that FAILED because a rank raised is deterministic and is not.
Only the last attempt is logged (tags seqpar.attempts and seqpar.failure, the kind).
A trial whose step time is unstable (a wide interval or a busy host, `workers.stability`) carries the
reason in the tag seqpar.unstable; with `rerun_unstable` N it is measured again up to N more times
until one round is stable, and the stable round (else the one with the narrowest interval) is logged
with tag seqpar.rounds.
Ctrl-C marks the sweep KILLED and leaves it resumable; so does any error, whose line names the
`--resume` id. Every trial runs under its name (`metrics.trial_tag`: short label and spec hash),
which its remote calls and every rank series carry. What the sweep keeps of each trial: `outcome`;
what the driver says while it runs: `progress`, `notices`.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable

from rich.console import Console
from rich.markup import escape

from seqpar.experiments.grid import Point
from seqpar.platform import metrics
from seqpar.platform.tracking import HASH_TAG, Tracker
from seqpar.sweeps import report
from seqpar.sweeps.notices import MissingArtifacts, TrialCounts, trial_line
from seqpar.sweeps.outcome import DetailKeeper, KeptTrial, SweepOutcome, TrialOutcome
from seqpar.sweeps.progress import SweepProgress
from seqpar.sweeps.record import finish, log_one, start
from seqpar.sweeps.report.view import TrialView
from seqpar.sweeps.spec import SweepPlan
from seqpar.workers.trial import TrialResult, TrialRunner


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


def run_sweep(plan: SweepPlan, *, tracker: Tracker, runner: TrialRunner, retries: int = 0,
              resume: str | None = None, progress: bool = True,
              on_trial_end: Callable[[TrialOutcome], None] | None = None,
              rerun_unstable: int = 0, console: Console | None = None) -> SweepOutcome:
    """Run every trial of `plan` not yet FINISHED in the sweep; see the module docstring. Progress
    and a line per trial go to `console` (the CLI's; default a console on stderr)."""
    if console is None:  # a pipe or a CI log: one line per trial, not rich's 80-column wrap
        console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)
    artifacts = MissingArtifacts(tracker, console)
    sweep, earlier = start(plan, tracker, resume)
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
                console.print(trial_line(result, label, attempts, live.count()), highlight=False)
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
    finish(tracker, outcome, console)
    artifacts.check()
    artifacts.summary(sweep.sweep_id)
    return outcome
