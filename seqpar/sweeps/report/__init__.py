"""Tables, figures and the HTML page from MLflow runs (read back from the store, never from memory).

    view.py      Trial: one run's params parsed once (no string keys past it); per-rank details
    table.py     the comparison `seqpar compare` prints (best by the metric, x local, the 95%
                 interval, oversubscribed and unstable trials)
    baseline.py  `compare --baseline NAME`: each trial's time ratio with its interval and verdict
    plots/       one module per figure family, and `figures(trials)`: name -> Figure
    headline.py  the best trial, overall and per algorithm
    page.py      the sweep as one self-contained HTML page
    summary.py   all of it logged on the sweep's parent run
"""

from seqpar.sweeps.report.baseline import baseline_comparison
from seqpar.sweeps.report.headline import best_run, headline_metrics
from seqpar.sweeps.report.page import build as build_page
from seqpar.sweeps.report.plots import figures
from seqpar.sweeps.report.summary import log_summary
from seqpar.sweeps.report.table import Comparison, comparison
from seqpar.sweeps.report.view import Trial, trials

__all__ = ["Comparison", "Trial", "baseline_comparison", "best_run", "build_page", "comparison",
           "figures", "headline_metrics", "log_summary", "trials"]
