"""The comparison `seqpar compare` and a finished sweep print and the sweep's parent run stores: one
row per trial, the best by the metric highlighted, the median step time with its 95% interval in one
cell, the speed-up over `local` at the same shape, and flags: O oversubscribed (a CPU run with more
ranks than cores), U unstable (a wide interval, a busy host or mixed kernels), F failed.

`table` gives every column (the page, MLflow's table and `--json` show them); `Comparison.terse()`
is what a terminal shows: the columns whose value is the same in every row move to the title, the
reasons and causes to one line each under the table, and the flags get a one-line legend, so a
sweep such as the quickstart fits 120 columns (80 with its algorithm names folded). One number
format serves the table, the headline and the page (`cell`, `metric_text`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from seqpar.errors import ConfigError
from seqpar.experiments.registry import higher_is_better
from seqpar.platform.tracking import Tracker
from seqpar.sweeps.report.view import SweepView, TrialView, trials
from seqpar.workers.stability import short_reason

# metric -> (column, divisor, format): how every table and headline prints it ("3": three
# significant digits, never an exponent: 1460 / 138 / 12.3 / 5.43)
FORMATS: dict[str, tuple[str, float, str]] = {
    "step_ms": ("step ms", 1.0, "3"),
    "tokens_per_s": ("tok/s", 1.0, ",.0f"),
    "peak_mem_bytes": ("peak MiB", 2.0**20, "3"),
    "bytes_total": ("MB sent", 1e6, ".2f"),
    "bytes_inter": ("MB inter", 1e6, ".2f"),
    "load_imbalance": ("imbal.", 1.0, ".2f"),
}
UNITS = {"peak_mem_bytes": " MiB", "bytes_total": " MB", "bytes_inter": " MB"}
STEP = "step ms (95% CI)"
# the columns that describe a trial (the rest are its results): the ones a terse table may fold
DESCRIBING = ("algorithm", "P", "nodes", "layout", "N", "H/Hkv", "dtype", "mask", "cores")
FLAGS = {"O": "oversubscribed (ranks > cores)", "U": "unstable (--rerun-unstable N)", "F": "failed"}


def number(value: float | None) -> str:
    """A metric without a format of its own: 21,062 / 123.5 / 0.001234 / 1.20e-06."""
    if value is None or not math.isfinite(value):
        return "-"
    size = abs(value)
    if size >= 1e4 or size == 0:
        return f"{value:,.0f}"
    return f"{value:.4g}" if size >= 1e-3 else f"{value:.2e}"


def cell(metric: str, value: float | None) -> str:
    """`value` of `metric` as its table column prints it (scaled to the column's unit)."""
    if value is None or not math.isfinite(value):
        return "-"
    if metric in FORMATS:
        _, divisor, spec = FORMATS[metric]
        return three(value / divisor) if spec == "3" else format(value / divisor, spec)
    return number(value)


def three(value: float) -> str:
    """Three significant digits, no exponent (whole numbers from 100 up): 1460, 138, 12.3, 5.43."""
    size = abs(value)
    return f"{value:.0f}" if size >= 99.95 else f"{value:.1f}" if size >= 9.995 else f"{value:.2f}"


def metric_text(metric: str, value: float | None) -> str:
    """`value` of `metric` as a headline prints it: its table cell, with the unit."""
    text = cell(metric, value)
    return text + UNITS.get(metric, "") if text != "-" else text


@dataclass
class Comparison:
    title: str
    columns: list[str]
    rows: list[list[Any]]
    best: int | None
    metric: str
    legend: str = ""                                  # the flags in use, one line
    notes: list[str] = field(default_factory=list)    # one line each: unstable reasons, causes
    trials: list[TrialView] = field(default_factory=list)  # the rows' trials, in row order

    def terse(self) -> Comparison:
        """The table as a terminal shows it: describing columns that are the same in every row go
        to the title; the reasons and causes (already in `notes`) and the cores (the O flag)
        leave the rows."""
        keep, constant = [], []
        for i, col in enumerate(self.columns):
            values = {str(r[i]) for r in self.rows}
            if col in ("unstable", "status", "cores"):  # in notes; in the O flag
                continue
            if col in DESCRIBING and len(values) == 1 and len(self.rows) > 1:
                constant.append(f"{col} {values.pop()}")
                continue
            keep.append(i)
        title = self.title + ("; " + ", ".join(constant) if constant else "")
        return replace(self, title=title, columns=[self.columns[i] for i in keep],
                       rows=[[r[i] for i in keep] for r in self.rows])


def sort_key(t: TrialView) -> tuple:
    return (t.seq_len, t.kv_heads or 0, t.world,
            t.config, t.mask_spec or "", t.layout or "", -(t.window or 1 << 62), t.dtype or "")


def select(tracker: Tracker, study: str | None, sweep: str | None
           ) -> tuple[str, list[TrialView], str | None]:
    """The trials of a sweep, a study, or (neither given) the latest sweep in the store, read
    back: (title, trials, the metric the sweep ranks by)."""
    if sweep is not None:
        view = SweepView.read(tracker, sweep, "--sweep")
        return view.title, trials(tracker.trials(sweep)), view.headline
    if study is not None:
        return f"study {study}", trials(tracker.study_trials(study)), None
    latest = tracker.latest_sweep()
    if latest is None:
        raise ConfigError("tracking-uri", tracker.uri, "holds no sweep yet; run `seqpar sweep` first")
    runs = trials(tracker.trials(latest.run_id))
    return (f"sweep {latest.name} ({latest.run_id})", runs,
            latest.tags.get("seqpar.headline"))


def comparison(tracker: Tracker, study: str | None = None, sweep: str | None = None,
               metric: str | None = None) -> Comparison:
    """`table` of trials read back from the store (`seqpar compare`)."""
    title, runs, headline = select(tracker, study, sweep)
    return table(title, runs, metric or headline or "tokens_per_s")


def interval(t: TrialView) -> str:
    """The step time's 95% interval as '11.9-12.8' (as the step prints); '-' when not logged."""
    ci = t.interval
    if ci is None:
        return "-"
    return "-".join(cell("step_ms", v) for v in ci)


def step_cell(t: TrialView) -> str:
    """'12.3 (11.9-12.8)': the median step and its interval in one cell."""
    step = cell("step_ms", t.metrics.get("step_ms"))
    ci = interval(t)
    return step if ci == "-" or step == "-" else f"{step} ({ci})"


def status(t: TrialView) -> str:
    """FINISHED, or the failure with its cause."""
    return t.status if t.finished else f"{t.status}: {t.cause[:80]}"


def flags(t: TrialView) -> str:
    return ("O" if t.oversubscribed else "") + ("U" if t.unstable else "") + (
        "" if t.finished else "F")


def _same_shape(t: TrialView) -> tuple:
    """Trials at the same (N, H, Hkv, mask, dtype): `local` among them is the speed-up baseline."""
    return (t.seq_len, t.heads, t.kv_heads, t.mask, t.dtype)


def _notes(runs: list[TrialView]) -> list[str]:
    out = [f"U {t.config} P={t.world} N={t.seq_len}: {short_reason(t.unstable)}"
           for t in runs if t.unstable]
    return out + [f"F {t.config} P={t.world} N={t.seq_len}: {t.status}: {t.cause}"
                  for t in runs if not t.finished]


def table(title: str, runs: list[TrialView], metric: str) -> Comparison:
    """Every column for these trials, ranked by `metric` in its direction."""
    logged = {k for t in runs for k in t.metrics}
    if logged and metric not in logged:
        raise ConfigError("metric", metric, f"is not logged here; one of {', '.join(sorted(logged))}")
    runs = sorted(runs, key=sort_key)
    local = {_same_shape(t): t.metrics.get("tokens_per_s") for t in runs
             if t.algorithm == "local" and t.finished}
    dtypes = len({t.dtype for t in runs}) > 1
    masks = len({t.mask for t in runs}) > 1 or any(t.mask not in ("causal", "full") for t in runs)
    inter = any(t.metrics.get("bytes_inter", 0) > 0 for t in runs)  # the plan spans nodes
    extra = metric not in FORMATS
    shaky = any(t.unstable for t in runs)
    columns = ["algorithm", "P", "nodes", "layout", "N", "H/Hkv", *(["dtype"] if dtypes else []),
               *(["mask"] if masks else []), "cores", STEP, FORMATS["tokens_per_s"][0], "x local",
               FORMATS["peak_mem_bytes"][0], FORMATS["bytes_total"][0],
               *([FORMATS["bytes_inter"][0]] if inter else []), FORMATS["load_imbalance"][0],
               *([metric] if extra else []), "flags", *(["unstable"] if shaky else []), "status"]
    rows, scores = [], []
    for t in runs:
        m = t.metrics
        base = local.get(_same_shape(t))
        speedup = m["tokens_per_s"] / base if base and "tokens_per_s" in m else None
        rows.append([
            t.config, str(t.world), t.nodes or "1", t.layout, str(t.seq_len),
            f"{t.heads}/{t.kv_heads}", *([t.dtype] if dtypes else []), *([t.mask] if masks else []),
            str(t.cores or "-"), step_cell(t), cell("tokens_per_s", m.get("tokens_per_s")),
            "-" if speedup is None else f"{speedup:.2f}", cell("peak_mem_bytes",
                                                               m.get("peak_mem_bytes")),
            cell("bytes_total", m.get("bytes_total")),
            *([cell("bytes_inter", m.get("bytes_inter"))] if inter else []),
            cell("load_imbalance", m.get("load_imbalance")),
            *([cell(metric, m.get(metric))] if extra else []), flags(t),
            *([short_reason(t.unstable) if t.unstable else ""] if shaky else []), status(t)])
        scores.append(m.get(metric) if t.finished else None)
    valid = [(s, i) for i, s in enumerate(scores) if s is not None]
    best = None
    if valid:
        best = (max(valid) if higher_is_better(metric) else min(valid))[1]
    direction = "higher" if higher_is_better(metric) else "lower"
    used = sorted({f for r in rows for f in r[columns.index("flags")]}, key="OUF".index)
    legend = ("flags: " + "; ".join(f"{f} {FLAGS[f]}" for f in used)) if used else ""
    return Comparison(f"{title}: best by {metric} ({direction} is better)", columns, rows, best,
                      metric, legend, _notes(runs), runs)
