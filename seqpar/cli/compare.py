"""`seqpar compare`: runs read back from MLflow as a table, the best one highlighted, or each trial
against a baseline (`--baseline NAME`)."""

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
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON rows.")] = False,
) -> None:
    """Compare runs (default: the latest sweep) from the MLflow store."""
    from seqpar.sweeps import report  # torch: not for --help

    if study is not None and sweep is not None:
        raise ConfigError("--study", study, "give --study or --sweep, not both")
    if baseline is not None and metric is not None:
        raise ConfigError("--metric", metric, "--baseline compares step time; drop --metric")
    tracker = options.tracker(options.Settings.of(ctx), existing=True)
    if baseline is not None:
        cmp = report.baseline_comparison(tracker, baseline, study=study, sweep=sweep)
    else:
        cmp = report.comparison(tracker, study=study, sweep=sweep, metric=metric)
    display_comparison(cmp, as_json=as_json)
    if not as_json:
        print_compare_link(tracker, cmp.trials)
