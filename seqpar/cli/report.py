"""`seqpar report SWEEP_ID [-o report.html]`: a sweep as one self-contained HTML page (and every
trial's row in report.csv beside it, which the page links); with --log
(the default) its figures and the page go on the sweep's run again (after a sweep whose artifact
store was full, once it has room)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from seqpar.cli import options
from seqpar.cli.display import console
from seqpar.errors import ConfigError


def report(
    ctx: typer.Context,
    sweep_id: Annotated[str | None, typer.Argument(
        help="The sweep id (its parent run id); default: the latest sweep.")] = None,
    output: Annotated[Path, typer.Option("-o", "--output", help="Where to write the page.")] =
        Path("report.html"),
    log: Annotated[bool, typer.Option("--log/--no-log", help="Also store it and its figures as "
                                                              "the sweep's artifacts (report.html, "
                                                              "plots/*.png).")] = True,
) -> None:
    """Write a sweep's tables, plots and environment as one HTML page (no external files)."""
    from seqpar.sweeps.report import build_with_figures  # torch: not for --help

    tracker = options.tracker(options.Settings.of(ctx), existing=True)
    if sweep_id is None:
        latest = tracker.latest_sweep()
        if latest is None:
            raise ConfigError("tracking-uri", tracker.uri, "holds no sweep yet; run `seqpar sweep`")
        sweep_id = latest.run_id
    table = output.with_suffix(".csv")  # every trial, beside the page (which links it)
    page, pngs, rows = build_with_figures(tracker, sweep_id, csv_name=table.name)
    try:
        output.write_text(page)
        table.write_text(rows)
    except OSError as err:
        raise ConfigError("output", str(output), f"cannot be written ({err.strerror})") from None
    if log:
        for name, data in pngs.items():
            tracker.log_bytes(sweep_id, data, f"plots/{name}.png")
        tracker.log_text(sweep_id, rows, table.name)
        tracker.log_text(sweep_id, page, "report.html")
    console.print(f"wrote {output} ({len(page) / 1024:.0f} KiB) and {table.name} (every trial) "
                  f"for sweep {sweep_id}")
    if tracker.missing:
        m = tracker.missing[0]
        console.print(f"[yellow]warning:[/yellow] {len(tracker.missing)} artifact(s) not stored on "
                      f"the sweep's run ({escape(m.where)}: {escape(m.error)})", highlight=False,
                      soft_wrap=True)
    elif log:
        console.print(f"stored report.html and {len(pngs)} figure(s) on the sweep's run",
                      highlight=False)
