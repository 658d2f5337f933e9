"""Everything the sweep's parent run shows in the MLflow UI: the headline metrics and best trial, the
comparison table (a sortable MLflow table), the figures, and the self-contained HTML page. Made from
the trials as the runner logged them (nothing is read back from the store)."""

from __future__ import annotations

from typing import Any

from seqpar.platform.tracking import Tracker
from seqpar.sweeps import style
from seqpar.sweeps.report import page
from seqpar.sweeps.report.digest import csv_text
from seqpar.sweeps.report.headline import best_run, headline_metrics
from seqpar.sweeps.report.plots import figures
from seqpar.sweeps.report.table import table
from seqpar.sweeps.report.view import SweepView, TrialView


def log_summary(tracker: Tracker, sweep: SweepView, runs: list[TrialView],
                details: dict[str, dict[str, Any]]) -> list[str]:
    """Log the sweep's summary on its parent run (`details`: run id -> per_rank.json of the
    trials); returns the names of the figures drawn."""
    metric = sweep.headline
    tracker.log_metrics(sweep.sweep_id, headline_metrics(runs, metric))
    best = best_run(runs, metric)
    if best is not None:
        tracker.set_tags(sweep.sweep_id, {"seqpar.best_trial": best.name,
                                          "seqpar.best_run_id": best.run_id})
    cmp = table(sweep.title, runs, metric)
    tracker.log_table(sweep.sweep_id, cmp.columns, cmp.rows, "comparison.json")
    csv_name = page.CSV if tracker.log_text(sweep.sweep_id, csv_text(cmp), page.CSV) else ""
    figs = figures(runs, details, metric)
    try:
        pngs = {name: page.png(fig) for name, fig in figs.items()}
        for name, data in pngs.items():
            tracker.log_bytes(sweep.sweep_id, data, f"plots/{name}.png")
        tracker.log_text(sweep.sweep_id, page.render(sweep, runs, cmp=cmp, pngs=pngs,
                                                     csv_name=csv_name), "report.html")
    finally:
        style.close(figs.values())
    return list(figs)
