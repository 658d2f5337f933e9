"""`seqpar compare`: runs read back from MLflow as a table, the best one highlighted, or each trial
against a baseline (`--baseline NAME`). A sweep of more than a screenful of trials is shown as its
digest (the winner of each group, the trials near it, the rest counted: `report.digest`); `--all`,
`--top N` and `--where KEY=VALUE` list the trials themselves."""

from __future__ import annotations

from typing import Annotated

import typer

from seqpar.cli import options
from seqpar.cli.display import display_comparison
from seqpar.cli.sweep import print_compare_link
from seqpar.errors import ConfigError


def compare(
    ctx: typer.Context,
    study: Annotated[str | None, typer.Option("--study", help="Every trial of a study "
                                                               "(an MLflow experiment).")] = None,
    sweep: Annotated[str | None, typer.Option("--sweep", help="The trials of one sweep "
                                                               "(its parent run id).")] = None,
    metric: Annotated[str | None, typer.Option(
        "--metric", help="Rank by this metric (default: the study's headline, e.g. tokens_per_s; "
                         "step_ms, peak_mem_bytes, bytes_total, load_imbalance, ...).")] = None,
    baseline: Annotated[str | None, typer.Option(
        "--baseline", help="Each trial's step time over this algorithm's (e.g. local, ring, "
                           "'usp dcp=2 dhp=2') at the same shape, with the ratio's 95% interval; "
                           "'no measurable difference' where the intervals overlap.")] = None,
    every: Annotated[bool, typer.Option(
        "--all", help="Every trial, one row each (a long sweep otherwise shows the winner of "
                      "each group).")] = False,
    top: Annotated[int | None, typer.Option(
        "--top", metavar="N", help="The N best trials by the metric, best first.")] = None,
    where: Annotated[list[str] | None, typer.Option(
        "--where", metavar="KEY=VALUE", help="Only the trials whose column KEY reads VALUE, e.g. "
        "N=4096, algorithm=ring, P=4, flags=U (repeatable: all must hold).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON rows.")] = False,
) -> None:
    """Compare runs (default: the latest sweep) from the MLflow store."""
    from seqpar.sweeps import report  # torch: not for --help
    from seqpar.sweeps.report import digest

    if study is not None and sweep is not None:
        raise ConfigError("--study", study, "give --study or --sweep, not both")
    if baseline is not None and metric is not None:
        raise ConfigError("--metric", metric, "--baseline compares step time; drop --metric")
    tracker = options.tracker(options.Settings.of(ctx), existing=True)
    if baseline is not None:
        cmp = report.baseline_comparison(tracker, baseline, study=study, sweep=sweep)
    else:
        cmp = report.comparison(tracker, study=study, sweep=sweep, metric=metric)
    if where:
        cmp = digest.where(cmp, where)
    if top is not None:
        cmp = digest.top(cmp, top)
    if baseline is None and not (every or top is not None or as_json):
        again = "seqpar compare" + (f" --sweep {sweep}" if sweep else "") + (
            f" --study {study}" if study else "") + (f" --metric {metric}" if metric else "")
        cmp = digest.screen(cmp, again=again)
    display_comparison(cmp, as_json=as_json)
    if not as_json:
        print_compare_link(tracker, cmp.trials)
