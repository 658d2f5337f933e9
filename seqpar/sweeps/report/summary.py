"""Everything the sweep's parent run shows in the MLflow UI: the headline metrics and best trial, the
comparison table (a sortable MLflow table), the figures, and the self-contained HTML page."""

from __future__ import annotations

from seqpar.platform.tracking import Tracker
from seqpar.sweeps import style
from seqpar.sweeps.report import page
from seqpar.sweeps.report.headline import best_run, headline_metrics
from seqpar.sweeps.report.plots import figures
from seqpar.sweeps.report.table import comparison
from seqpar.sweeps.report.view import per_rank_details, trials


def log_summary(tracker: Tracker, sweep_id: str) -> list[str]:
    """Log the sweep's summary on its parent run; returns the names of the figures drawn."""
    record = tracker.sweep(sweep_id)
    runs = trials(tracker.trials(sweep_id))
    metric = record.tags.get("seqpar.headline") or "tokens_per_s"
    tracker.log_metrics(sweep_id, headline_metrics(runs, metric))
    best = best_run(runs, metric)
    if best is not None:
        tracker.set_tags(sweep_id, {"seqpar.best_trial": best.name, "seqpar.best_run_id": best.run_id})
    cmp = comparison(tracker, sweep=sweep_id, metric=metric)
    tracker.log_table(sweep_id, cmp.columns, cmp.rows, "comparison.json")
    figs = figures(runs, per_rank_details(tracker, runs))
    try:
        for name, fig in figs.items():
            tracker.log_figure(sweep_id, fig, f"plots/{name}.png")
        tracker.log_text(sweep_id, page.render(tracker, sweep_id, runs, cmp=cmp, figs=figs),
                         "report.html")
    finally:
        style.close(figs.values())
    return list(figs)
