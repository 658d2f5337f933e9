"""Tables, figures and the HTML page of a sweep: made from its trials as the runner logged them (a
finished sweep), or read back from MLflow (an old sweep, a study: `seqpar compare`, `seqpar report`).

    view.py      TrialView and SweepView: a run's params parsed once (no string keys past it);
                 per-rank details
    table.py     the comparison (best by the metric, x local, the step with its 95% interval,
                 flags for oversubscribed, unstable and failed trials) and the one number format
    baseline.py  `compare --baseline NAME`: each trial's time ratio with its interval and verdict
    plots/       one module per figure family, and `figures(trials)`: name -> Figure
    headline.py  the best trial, overall and per algorithm
    page.py      the sweep as one self-contained HTML page
    summary.py   all of it logged on the sweep's parent run
"""

from seqpar.sweeps.report.baseline import baseline_comparison
from seqpar.sweeps.report.headline import best_run, headline_metrics
from seqpar.sweeps.report.page import build as build_page
from seqpar.sweeps.report.page import build_with_figures
from seqpar.sweeps.report.plots import figures
from seqpar.sweeps.report.summary import log_summary
from seqpar.sweeps.report.table import Comparison, cell, comparison, metric_text, table
from seqpar.sweeps.report.view import SweepView, TrialView, per_rank_details, trials

__all__ = ["Comparison", "SweepView", "TrialView", "baseline_comparison", "best_run", "build_page",
           "build_with_figures", "cell", "comparison", "figures", "headline_metrics", "log_summary",
           "metric_text", "per_rank_details", "table", "trials"]
