"""A sweep as one self-contained HTML page: the headline, the comparison table, every plot inlined as a
PNG data URI, and the environment the numbers were measured in (versions, host, cores, device,
commit).

    page = build(tracker, sweep_id)        # an old sweep, read back from MLflow
    Path("report.html").write_text(page)   # no external files: attach it to a PR or an appendix

A finished sweep's page is rendered from memory (`render`, by `summary.log_summary`). A long sweep's
page stays the size of its groups, not of its trials: its table is the digest (the winner of every
group, the trials near it: `digest.digest`), every trial is in the CSV beside it (`CSV`, a link),
and the figures aggregate (one line per configuration across lengths, a map of the winners where
two axes vary). A trial whose
per_rank.json artifact is missing (the artifact store was full) gets its per-rank breakdown from its
own metrics, and the page says which trials that is, and which have no breakdown at all.
"""

from __future__ import annotations

import base64
import datetime as dt
import io
from html import escape
from typing import Any

from seqpar.experiments.registry import higher_is_better
from seqpar.platform.tracking import Tracker
from seqpar.sweeps import style
from seqpar.sweeps.report.digest import SCREEN, csv_text, digest
from seqpar.sweeps.report.headline import best_run, headline_metrics
from seqpar.sweeps.report.plots import detail_candidates, figures
from seqpar.sweeps.report.table import BEST, Comparison, metric_text, table
from seqpar.sweeps.report.view import (
    SweepView,
    TrialView,
    per_rank_details,
    trials,
    without_details,
)

ENVIRONMENT_TAGS = (("seqpar commit", "seqpar.git_commit"), ("torch", "seqpar.torch_version"),
                    ("ray", "seqpar.ray_version"), ("mlflow", "seqpar.mlflow_version"),
                    ("host", "seqpar.host"), ("cores", "seqpar.cpu_count"))

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:1200px;
color:#222;padding:0 1em}
h1{font-size:1.5em;margin-bottom:.2em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}
th,td{border:1px solid #ddd;padding:.25em .6em;text-align:right;white-space:nowrap}
th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}
tr.best td{background:#e6f4ea;font-weight:600}.over{color:#c00}.unstable{color:#a60}
figure{margin:1em 0}figure img{max-width:100%;border:1px solid #eee}
figcaption{font-size:.85em;color:#555}.meta{color:#555;font-size:.9em}
"""

CSV = "report.csv"  # every trial's row, beside the page (an artifact of the sweep's run)

CAPTIONS = {
    "throughput_vs_seq_len": "Tokens per second against sequence length; the band is the 95% "
                             "confidence interval of the median over the timed iterations (a "
                             "bootstrap), and a hollow marker is an unstable trial (a wide "
                             "interval or a busy host: see the table's reason).",
    "memory_vs_seq_len": "Peak memory of one rank against sequence length.",
    "scaling_vs_world": "Speed-up over the one-rank run and parallel efficiency; the dashed line "
                        "is ideal scaling, the band the 95% interval, hollow markers unstable "
                        "trials.",
    "bytes_by_link": "Bytes the whole gang sends per step, by link (intra / inter node).",
    "bytes_measured_vs_analytic": "Bytes one rank sends per step: the ledger's measurement beside "
                                  "the algorithm's formula (the ratio should be 1.00).",
    "per_rank_breakdown": "Each rank's step split into compute, waiting (load imbalance) and "
                          "exposed communication (a model from FLOPs and step times).",
    "accuracy_vs_world": "Relative error (max |x - ref| / max |ref|) of out, dq, dk, dv against a "
                         "float64 single-process reference on the same inputs, by world size; "
                         "world 1 is the one-process kernel in that dtype.",
    "varlen_balance": "Packed documents: tokens/s per algorithm and layout, with what equal work "
                      "per rank would give (with a core per rank; on an oversubscribed CPU an idle "
                      "rank lends its core, so imbalance costs less there), and the load imbalance "
                      "(max/mean FLOPs over ranks) beside the ideal 1.0.",
    "sp_policies": "Steps of variable-length sequences: each SP policy's tokens per second per "
                   "rank by algorithm (whiskers: the step's 95% interval), and the ranks' idle "
                   "time a step (no micro-batch to run before the pool's last one ended).",
    "length_distribution": "The sweep's length distribution: the lengths, and by length the share "
                            "of the sequences, of their tokens and of their attention work (L²): "
                            "a long tail holds much of the work in few sequences.",
    "step_timeline": "One step of a trial, rank by rank: each micro-batch from its start to its "
                     "end (the tick: its forward's end), coloured by its group's size and "
                     "labelled by its sequences; disjoint groups run at the same time.",
    "bytes_vs_seq_len": "Bytes the whole gang sends per step against sequence length, one line per "
                        "configuration (dashed: the inter-node share).",
    "bytes_ratio_vs_seq_len": "Bytes one rank sends per step, measured by the ledger over the "
                              "algorithm's formula, against sequence length (1.00: they agree).",
    "winners_map": "The winner of each cell where two of the sweep's axes vary: its colour is the "
                   "configuration with the best headline metric there (the legend), its text how "
                   "far ahead of the runner-up it is.",
    "window_savings": "Sliding window W against full causal: step time, attention FLOPs and bytes "
                      "as a fraction of full causal; the dashed line is the fraction of visible "
                      "(query, key) pairs.",
}


def png(fig: Any) -> bytes:
    """A figure as the PNG the page embeds and the parent run keeps (drawn once for both)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return buf.getvalue()


def _table(columns: list[str], rows: list[list[Any]], best: int | None = None,
           table_id: str = "") -> str:
    head = "".join(f"<th>{escape(str(c))}</th>" for c in columns)
    body = []
    marked = {columns.index(c): c for c in ("unstable", "flags") if c in columns}

    def td(j: int, v: Any) -> str:
        css = ""
        if marked.get(j) == "flags" and "O" in str(v):
            css = ' class="over"'
        elif j in marked and str(v).strip(BEST):  # the best's star alone is no warning
            css = ' class="unstable"'
        return f"<td{css}>{escape(str(v))}</td>"

    for i, row in enumerate(rows):
        cls = ' class="best"' if i == best else ""
        body.append(f"<tr{cls}>{''.join(td(j, v) for j, v in enumerate(row))}</tr>")
    ident = f' id="{table_id}"' if table_id else ""
    return f"<table{ident}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _stability(runs: list[TrialView], again: str) -> list[str]:
    """How many step times can be trusted, and what to do about the rest (`again`: the command
    that ran the sweep)."""
    timed = [t for t in runs if t.finished and t.interval is not None]
    if not timed:
        return []
    shaky = [t for t in timed if t.unstable]
    text = (f"{len(timed) - len(shaky)} of {len(timed)} trials stable: a 95% interval within ±10% "
            "of the median on a host other processes left alone.")
    if shaky:
        text += (f" {len(shaky)} unstable (reasons in the table): measure them again "
                 f"(<code>{escape(again)} --rerun-unstable 2</code>), with more "
                 "<code>workload.iters</code>, or on a quieter host: stop other jobs, give each "
                 "rank its own core.")
    return [f'<p class="meta" id="stability">{text}</p>']


def _missing(runs: list[TrialView], details: dict[str, dict[str, Any]] | None) -> list[str]:
    """What the page could not get of the per-rank records its figures use, said plainly."""
    if details is None:
        return []
    from_metrics, none = without_details(detail_candidates(runs), details)
    out = []
    if from_metrics:
        out.append(f"per_rank.json is missing for {len(from_metrics)} trial(s) (the artifact "
                   "store could not take it when they ran): their per-rank breakdown is drawn "
                   "from each rank's median step and FLOPs logged in the run; the rest of the "
                   f"record (ledger, memory views) is lost: {', '.join(from_metrics)}")
    if none:
        out.append(f"no per-rank record for {len(none)} trial(s): {', '.join(none)}")
    return [f'<p class="meta" id="missing">{escape(text)}</p>' for text in out]


def _comparison(cmp: Comparison, csv_name: str) -> list[str]:
    """The comparison: every trial (SCREEN or fewer: the page stays self-contained), else the
    winner of every group and the link to the CSV of every trial written beside the page."""
    if len(cmp.rows) <= SCREEN:
        return [f'<p class="meta">{escape(cmp.title)}</p>',
                _table(cmp.columns, cmp.rows, cmp.best, table_id="comparison"),
                *([f'<p class="meta">{escape(cmp.legend)}</p>'] if cmp.legend else [])]
    link = (f'<p class="meta">every trial ({len(cmp.rows)} rows, every column): '
            f'<a href="{escape(csv_name)}" download>{escape(csv_name)}</a></p>' if csv_name else "")
    shown = digest(cmp, max_groups=None).terse()
    notes = [f'<p class="meta">{escape(n)}</p>' for n in shown.notes if not n.startswith(
        ("every trial:", "  or --top"))]
    return [f'<p class="meta">{escape(shown.title)}</p>',
            _table(shown.columns, shown.rows, shown.best, table_id="comparison"),
            *([f'<p class="meta">{escape(shown.legend)}</p>'] if shown.legend else []),
            *notes, link]


def render(sweep: SweepView, runs: list[TrialView], *, cmp: Comparison,
           pngs: dict[str, bytes], details: dict[str, dict[str, Any]] | None = None,
           csv_name: str = "") -> str:
    """The page for a sweep whose trials, comparison and figures (`png`) are already built;
    `csv_name`: the CSV of every trial written beside it ('': none, no link)."""
    metric = cmp.metric
    headline = headline_metrics(runs, metric)
    best = best_run(runs, metric)
    devices = sorted({t.device or "?" for t in runs})
    env_rows = [[name, sweep.tags.get(tag, "?")] for name, tag in ENVIRONMENT_TAGS]
    env_rows += [["device", ", ".join(devices)], ["MLflow store", sweep.store],
                 ["experiment", sweep.experiment], ["sweep id", sweep.sweep_id]]
    started = dt.datetime.fromtimestamp(sweep.start_time / 1e3, dt.UTC).strftime(
        "%Y-%m-%d %H:%M UTC")
    best_value = headline.get(f"best.{metric}")
    parts = [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        f"<title>seqpar report: {escape(sweep.name)}</title><style>{CSS}</style></head><body>",
        f"<h1>seqpar sweep <code>{escape(sweep.name)}</code></h1>",
        f'<p class="meta">{len(runs)} trial(s), started {started}; headline metric '
        f"<b>{escape(metric)}</b> ({'higher' if higher_is_better(metric) else 'lower'} "
        "is better)</p>",
        "<h2>Headline</h2>",
        _table(["", metric], [["best trial: " + (best.name if best else "-"),
                               metric_text(metric, best_value)]]
               + [[k.split(".")[0], metric_text(metric, v)] for k, v in headline.items()
                  if not k.startswith("best.")], table_id="headline"),
        "<h2>Comparison</h2>", *_comparison(cmp, csv_name),
        *_stability(runs, sweep.command),
        "<h2>Plots</h2>",
    ]
    for name, data in pngs.items():
        image = base64.b64encode(data).decode("ascii")
        parts.append(f'<figure id="{name}"><img alt="{name}" src="data:image/png;base64,{image}">'
                     f"<figcaption>{escape(CAPTIONS.get(name, name))}</figcaption></figure>")
    if not pngs:
        parts.append("<p>No plot: these trials vary neither length, world nor bytes.</p>")
    parts += _missing(runs, details)
    parts += ["<h2>Environment</h2>", _table(["", "value"], env_rows, table_id="environment"),
              "</body></html>"]
    return "\n".join(parts)


def build(tracker: Tracker, sweep_id: str) -> str:
    """The page of an old sweep, read back from the store (figures drawn afresh)."""
    return build_with_figures(tracker, sweep_id)[0]


def build_with_figures(tracker: Tracker, sweep_id: str, csv_name: str = ""
                       ) -> tuple[str, dict[str, bytes], str]:
    """The page of an old sweep, its figures as PNGs (`seqpar report` logs them again) and the CSV
    of every trial (`csv_name`: where the page links it)."""
    sweep = SweepView.read(tracker, sweep_id, "sweep_id")
    runs = trials(tracker.trials(sweep_id))
    cmp = table(sweep.title, runs, sweep.headline)
    details = per_rank_details(tracker, detail_candidates(runs))  # a dozen, not every trial's
    figs = figures(runs, details, sweep.headline)
    try:
        pngs = {name: png(f) for name, f in figs.items()}
        page = render(sweep, runs, cmp=cmp, pngs=pngs, details=details, csv_name=csv_name)
        return page, pngs, csv_text(cmp)
    finally:
        style.close(figs.values())
