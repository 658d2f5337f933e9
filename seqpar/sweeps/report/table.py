"""The comparison `seqpar compare` and a finished sweep print and the sweep's parent run stores: one
row per trial, the trials of one workload (N, heads, mask, dtype, model, lengths) together and the best
of them first, the median step time with its 95% interval in one cell, the speed-up over `local` at
the same shape, and flags: * the best of its workload by the metric, O oversubscribed (a CPU run with
more ranks than cores), U unstable (a wide interval, a busy host or mixed kernels), F failed.

`table` gives every column (the page, MLflow's table and `--json` show them); `Comparison.terse()`
is what a terminal shows: the columns whose value is the same in every row move to the title, the
reasons and causes to one line each under the table (each naming its row as the row names itself:
its algorithm and the describing cells that vary), and the flags get a one-line legend, so a
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
DESCRIBING = ("algorithm", "P", "nodes", "layout", "N", "H/Hkv", "model", "dtype", "mask",
              "cores")
FLAGS = {"O": "oversubscribed (ranks > cores)", "U": "unstable (--rerun-unstable N)", "F": "failed"}
BEST = "*"  # the flag of the best trial of its workload (its text says by which metric)
# the describing columns that make a workload: trials that agree on them compete for the star
WORKLOAD = ("N", "H/Hkv", "model", "mask", "dtype")


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
    star: str = ""  # what the flag * says: 'best by tokens_per_s at its N'

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

    def labels(self) -> list[str]:
        """Each row's name as the table tells it apart: its algorithm cell and every describing
        cell that varies ('burst SP=2 DP=1 ckpt=sc++ layout=balanced mask=causal')."""
        naming = naming_columns(self.columns, self.rows)
        return [" ".join([str(r[0]), *(f"{self.columns[k]}={r[k]}" for k in naming)])
                for r in self.rows]

    def legend_of(self, rows: list[list[Any]]) -> str:
        """The flags these rows carry, explained in one line."""
        if "flags" not in self.columns:
            return ""
        used = {f for r in rows for f in str(r[self.columns.index("flags")])}
        marks = {BEST: self.star, **FLAGS}
        return ("flags: " + "; ".join(f"{f} {marks[f]}" for f in marks if f in used)
                if used else "")


def naming_columns(columns: list[str], rows: list[list[Any]]) -> list[int]:
    """The describing columns besides the algorithm whose value varies between rows: with the
    algorithm, what tells the rows apart."""
    return [i for i, c in enumerate(columns) if c in DESCRIBING and c not in ("algorithm", "cores")
            and len({str(r[i]) for r in rows}) > 1]


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


def workload(t: TrialView) -> tuple:
    """What a trial computes (its shape, mask, dtype, model, lengths), in the table's order: the
    trials that agree on it compete for the best of it."""
    return (t.seq_len, t.kv_heads or 0, t.heads or 0, t.mask_spec or "", -(t.window or 1 << 62),
            t.mask, t.dtype or "", t.training.model if t.training else "", t.lengths or "")


def _ranked(runs: list[TrialView], metric: str) -> list[TrialView]:
    """The trials by workload, each workload's best first by `metric` (the failed last)."""
    sign = -1 if higher_is_better(metric) else 1

    def key(t: TrialView) -> tuple:
        score = t.metrics.get(metric) if t.finished else None
        return (workload(t), score is None, sign * score if score is not None else 0, sort_key(t))

    return sorted(runs, key=key)


def _stars(runs: list[TrialView], metric: str) -> set[int]:
    """The positions (in `runs`, ranked) of each workload's best, where two or more finished."""
    firsts: dict[tuple, list[int]] = {}
    for i, t in enumerate(runs):
        if t.finished and t.metrics.get(metric) is not None:
            firsts.setdefault(workload(t), []).append(i)
    return {found[0] for found in firsts.values() if len(found) > 1}


def _apart(columns: list[str], rows: list[list[Any]], runs: list[TrialView]) -> str:
    """The columns that set the workloads apart, as the table names them ('N', 'N, mask'); ''
    for one workload."""
    if len({workload(t) for t in runs}) < 2:
        return ""
    return ", ".join(columns[i] for i in naming_columns(columns, rows)
                     if columns[i] in WORKLOAD) or "workload"


def _notes(labels: list[str], runs: list[TrialView]) -> list[str]:
    """One line an unstable or failed trial, naming its row as the table does."""
    out = [f"U {name}: {short_reason(t.unstable)}" for name, t in zip(labels, runs, strict=True)
           if t.unstable]
    return out + [f"F {name}: {t.status}: {t.cause}" for name, t in zip(labels, runs, strict=True)
                  if not t.finished]


def table(title: str, runs: list[TrialView], metric: str) -> Comparison:
    """Every column for these trials, by workload, each workload's best by `metric` first and
    flagged *."""
    logged = {k for t in runs for k in t.metrics}
    if logged and metric not in logged:
        raise ConfigError("metric", metric, f"is not logged here; one of {', '.join(sorted(logged))}")
    runs = _ranked(runs, metric)
    stars = _stars(runs, metric)
    local = {_same_shape(t): t.metrics.get("tokens_per_s") for t in runs
             if t.algorithm == "local" and t.finished}
    dtypes = len({t.dtype for t in runs}) > 1
    models = len({t.training.model if t.training else "-" for t in runs}) > 1  # model-families
    masks = len({t.mask for t in runs}) > 1 or any(t.mask not in ("causal", "full") for t in runs)
    inter = any(t.metrics.get("bytes_inter", 0) > 0 for t in runs)  # the plan spans nodes
    extra = metric not in FORMATS
    shaky = any(t.unstable for t in runs)
    columns = ["algorithm", "P", "nodes", "layout", "N", "H/Hkv", *(["model"] if models else []),
               *(["dtype"] if dtypes else []),
               *(["mask"] if masks else []), "cores", STEP, FORMATS["tokens_per_s"][0], "x local",
               FORMATS["peak_mem_bytes"][0], FORMATS["bytes_total"][0],
               *([FORMATS["bytes_inter"][0]] if inter else []), FORMATS["load_imbalance"][0],
               *([metric] if extra else []), "flags", *(["unstable"] if shaky else []), "status"]
    rows, scores = [], []
    for i, t in enumerate(runs):
        m = t.metrics
        base = local.get(_same_shape(t))
        speedup = m["tokens_per_s"] / base if base and "tokens_per_s" in m else None
        rows.append([
            t.config, str(t.world), t.nodes or "1", t.layout, str(t.seq_len),
            f"{t.heads}/{t.kv_heads}",
            *([t.training.model if t.training else "-"] if models else []),
            *([t.dtype] if dtypes else []), *([t.mask] if masks else []),
            str(t.cores or "-"), step_cell(t), cell("tokens_per_s", m.get("tokens_per_s")),
            "-" if speedup is None else f"{speedup:.2f}", cell("peak_mem_bytes",
                                                               m.get("peak_mem_bytes")),
            cell("bytes_total", m.get("bytes_total")),
            *([cell("bytes_inter", m.get("bytes_inter"))] if inter else []),
            cell("load_imbalance", m.get("load_imbalance")),
            *([cell(metric, m.get(metric))] if extra else []),
            (BEST if i in stars else "") + flags(t),
            *([short_reason(t.unstable) if t.unstable else ""] if shaky else []), status(t)])
        scores.append(m.get(metric) if t.finished else None)
    valid = [(s, i) for i, s in enumerate(scores) if s is not None]
    best = None
    if valid:
        best = (max(valid) if higher_is_better(metric) else min(valid))[1]
    direction = "higher" if higher_is_better(metric) else "lower"
    apart = _apart(columns, rows, runs)
    said = f"best by {metric}" + (f" at each {apart}" if apart else "") + (
        f" ({direction} is better)") + (f": flagged {BEST}, first" if stars else "")
    star = f"best by {metric}" + (f" at its {apart}" if apart else "")
    cmp = Comparison(f"{title}: {said}", columns, rows, best, metric, trials=runs, star=star)
    return replace(cmp, legend=cmp.legend_of(rows), notes=_notes(cmp.labels(), runs))
