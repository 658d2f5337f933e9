"""`seqpar sweep FILE` and `seqpar run STUDY`: expand, validate (before any actor starts), run on
Ray, log every trial to MLflow, and print the comparison table."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from seqpar.cli import options
from seqpar.cli.display import console, display_comparison, display_table, err_console
from seqpar.errors import ConfigError, require
from seqpar.platform import connection, dashboard
from seqpar.platform.heap import bound_heap
from seqpar.platform.store import check_uri, compare_url

if TYPE_CHECKING:
    from seqpar.platform.tracking import Tracker
    from seqpar.sweeps.report.view import TrialView
    from seqpar.sweeps.spec import SweepPlan

Resume = Annotated[str | None, typer.Option(
    "--resume", help="Sweep id (the parent run id) to continue: trials already FINISHED there "
                     "are skipped.")]
DryRun = Annotated[bool, typer.Option("--dry-run", help="List the trials and skipped points; "
                                                        "run nothing.")]
Retries = Annotated[int, typer.Option("--retries", help="Re-run a trial that FAILED by a rank dying, "
                                                        "a timeout or start-up up to N times.")]
RerunUnstable = Annotated[int, typer.Option(
    "--rerun-unstable", help="Measure a trial whose step time is unstable (interval wider than "
                             "±10% of the median, or a busy host) again, up to N more rounds, "
                             "until one is stable.")]
Strict = Annotated[bool, typer.Option("--strict", help="Fail the whole sweep on any invalid "
                                                       "point, before anything runs.")]
Sets = Annotated[list[str] | None, typer.Option(
    "--set", help="key=value over every trial, e.g. --set workload.seq_len=8192 "
                  "--set plan.options.dhp=2 (repeatable; value read as YAML).")]


def sweep(
    ctx: typer.Context,
    file: Annotated[str, typer.Argument(help="A sweep file (YAML): base + grid (+ study).")],
    resume: Resume = None, dry_run: DryRun = False, retries: Retries = 0, strict: Strict = False,
    sets: Sets = None, rerun_unstable: RerunUnstable = 0,
) -> None:
    """Run every trial of a sweep file and compare them (see examples/)."""
    from seqpar.sweeps import spec

    plan = spec.load(file, spec.parse_sets(sets or []))
    execute(plan, resume=resume, dry_run=dry_run, retries=retries, strict=strict,
            again=f"seqpar sweep {file}", rerun_unstable=rerun_unstable,
            settings=options.Settings.of(ctx))


def run(
    ctx: typer.Context,
    study: Annotated[str, typer.Argument(help="A study name (see `seqpar studies`).")],
    preset: Annotated[str, typer.Option("--preset", help="cpu | gpu-cluster.")] = "cpu",
    sets: Sets = None, resume: Resume = None, dry_run: DryRun = False, retries: Retries = 0,
    strict: Strict = False, rerun_unstable: RerunUnstable = 0,
) -> None:
    """Run a named study (its own sweep), optionally with --set overrides."""
    from seqpar.sweeps import spec

    plan = spec.from_study(study, preset, spec.parse_sets(sets or []))
    execute(plan, resume=resume, dry_run=dry_run, retries=retries, strict=strict,
            again=f"seqpar run {study} --preset {preset}", rerun_unstable=rerun_unstable,
            settings=options.Settings.of(ctx))


def _device(plan: SweepPlan) -> str | None:
    devices = {p.spec.env.device for p in plan.trials}
    if len(devices) > 1:
        raise ConfigError("env.device", sorted(devices), "one sweep runs on one kind of device")
    device = devices.pop()
    return None if device == "auto" else device


def _print_dashboard() -> None:
    """Where to watch the ranks while the sweep runs (gang id: sweep-<first 8 of the sweep id>)."""
    for line in dashboard.how_to_look("seqpar:sweep-<sweep id[:8]>:rank-"):
        console.print(escape(line), highlight=False, soft_wrap=True)


def print_compare_link(tracker: Tracker, runs: list[TrialView]) -> None:
    """MLflow's compare-runs view of these trial runs (and how to serve the UI of a local store)."""
    if not runs:
        return
    url = compare_url(tracker.ui, [t.run_id for t in runs], [t.experiment_id for t in runs])
    console.print(f"compare in MLflow: {url}", highlight=False, soft_wrap=True)
    if tracker.ui_command is not None:
        console.print(f"  (serve it first: {tracker.ui_command})", highlight=False,
                      soft_wrap=True)


def execute(plan: SweepPlan, *, resume: str | None, dry_run: bool, retries: int, strict: bool,
            again: str, rerun_unstable: int = 0,
            settings: options.Settings | None = None) -> str | None:
    """Validate, list or run a SweepPlan, then print its comparison; returns the sweep id.
    `settings`: the command's (`--address`, `--tracking-uri`; default: the running command's)."""
    settings = settings or options.Settings.of()
    require(retries >= 0, "--retries", retries, "must be >= 0")
    require(rerun_unstable >= 0, "--rerun-unstable", rerun_unstable, "must be >= 0")
    plan.check(strict)
    device = _device(plan)
    for point in plan.skipped:
        console.print(f"[yellow]skipped[/yellow] {escape(point.label)}: {escape(str(point.error))}",
                      highlight=False)
    if dry_run:
        rows = [[i + 1, p.spec.hash, p.label, p.spec.plan.nodes, p.spec.env.device]
                for i, p in enumerate(plan.trials)]
        display_table(f"{plan.name}: {len(plan.trials)} trial(s) -> MLflow experiment "
                      f"{plan.experiment!r} (dry run)", ["#", "spec hash", "trial", "nodes", "device"],
                      rows)
        return None
    from seqpar.sweeps import record, report, runner  # torch: not for --help
    from seqpar.sweeps.report.digest import screen

    check_uri(settings.tracking_uri)  # a bad store address is bad input: before Ray starts
    tracker = None
    if resume is not None:  # an unknown id is bad input: say so before Ray starts
        tracker = options.tracker(settings)
        tracker.sweep(resume)
        finished = record.nothing_left(plan, tracker, resume)
        if finished is not None:  # every trial done: say so without starting Ray
            console.print(f"sweep {resume}: all {len(plan.trials)} trial(s) already FINISHED; "
                          "nothing to run")
            title = report.SweepView.read(tracker, resume, "resume").title
            cmp = screen(report.table(title, finished, plan.headline),
                         again=f"seqpar compare --sweep {resume}")
            display_comparison(cmp)
            return resume
    metadata = connection.job_metadata(plan.name, plan.study)  # the Ray job's labels
    bound_heap()  # before Ray starts: a long sweep's driver stays its size
    with options.trial_runner(settings, device=device, job_metadata=metadata) as trials:
        tracker = tracker or options.tracker(settings)  # once the cluster answers: a failed start
        console.print(f"{plan.name}: {len(plan.trials)} trial(s), results to {tracker.uri}")
        _print_dashboard()
        try:
            outcome = runner.run_sweep(plan, tracker=tracker, runner=trials, retries=retries,
                                resume=resume, rerun_unstable=rerun_unstable,
                                console=err_console)
        except KeyboardInterrupt:
            console.print("[yellow]interrupted[/yellow]; continue with "
                          f"`{again} --resume <sweep id>` (see `seqpar compare`)")
            raise typer.Exit(130) from None
    cmp = report.table(outcome.sweep.title, outcome.views(), plan.headline)
    cmp = screen(cmp, again=f"seqpar compare --sweep {outcome.sweep_id}")
    display_comparison(cmp)
    print_compare_link(tracker, cmp.trials)  # a long sweep's: the winners shown
    skipped = f", {outcome.resumed} already done" if outcome.resumed else ""
    missing = f" ({len(tracker.missing)} missing: listed above)" if tracker.missing else ""
    console.print(f"sweep id {outcome.sweep_id} (experiment {plan.experiment!r}): "
                  f"{len(outcome.trials)} run{skipped}, {len(outcome.failed)} failed; "
                  f"plots and per-rank JSON are MLflow artifacts{missing}")
    if outcome.failed:
        console.print(f"re-run the failed trials with `{again} --resume {outcome.sweep_id}`")
        raise typer.Exit(1)
    return outcome.sweep_id
