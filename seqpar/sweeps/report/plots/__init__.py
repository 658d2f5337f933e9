"""The sweep's figures in one style (`sweeps.style`), one module per family: lengths (throughput and
memory vs N), scaling (speed-up and efficiency vs world), links (bytes by link, measured vs
analytic), ranks (compute / waiting / communication), accuracy, documents, windows, training."""

from __future__ import annotations

from typing import Any

from seqpar.sweeps.report.plots.accuracy import accuracy_figure, accuracy_series
from seqpar.sweeps.report.plots.aggregate import (
    MAX_BARS,
    bytes_ratio_vs_seq_len,
    bytes_vs_seq_len,
    winners_map,
)
from seqpar.sweeps.report.plots.documents import varlen_figure
from seqpar.sweeps.report.plots.lengths import vs_seq_len
from seqpar.sweeps.report.plots.links import bytes_by_link, bytes_vs_analytic
from seqpar.sweeps.report.plots.policies import (
    distribution_figure,
    policies_figure,
    timeline_figure,
)
from seqpar.sweeps.report.plots.ranks import one_rank_rate, per_rank_figure, rank_breakdown
from seqpar.sweeps.report.plots.scaling import scaling_figure, scaling_points, scaling_series
from seqpar.sweeps.report.plots.training import train_figure
from seqpar.sweeps.report.plots.windows import visible_fraction, window_figure, window_savings
from seqpar.sweeps.report.table import sort_key
from seqpar.sweeps.report.view import TrialView

__all__ = ["accuracy_series", "config_ends", "detail_candidates", "figures", "rank_breakdown",
           "scaling_series", "visible_fraction", "window_savings"]

MAX_RANK_PANELS = 12
MAX_TIMELINES = 3


def _timed(runs: list[TrialView]) -> list[TrialView]:
    """The finished trials the timing figures draw (an accuracy trial is one pass: not timed)."""
    return [t for t in runs if t.finished and "err_max" not in t.metrics]


def _panel_key(t: TrialView) -> tuple:
    return (t.algorithm, sort_key(t))


def rank_panels(multi: list[TrialView]) -> list[TrialView]:
    """The trials of the per-rank breakdown, in panel order: every multi-rank trial when they fit
    (MAX_RANK_PANELS), else each configuration's first and last by shape (its smallest and its
    largest), the first configurations' up to MAX_RANK_PANELS."""
    if len(multi) <= MAX_RANK_PANELS:
        return sorted(multi, key=_panel_key)
    return config_ends(multi)[:MAX_RANK_PANELS]


def config_ends(multi: list[TrialView]) -> list[TrialView]:
    """Each configuration's first and last trial by shape, in panel order."""
    ends: dict[str, list[TrialView]] = {}
    for t in sorted(multi, key=_panel_key):
        ends.setdefault(t.config, [t, t])[1] = t
    picked = {t.run_id: t for pair in ends.values() for t in pair}
    return sorted(picked.values(), key=_panel_key)


def detail_candidates(runs: list[TrialView]) -> list[TrialView]:
    """The trials whose per_rank.json the figures read, whatever the sweep's size: the per-rank
    breakdown's (`rank_panels`) and the first MAX_TIMELINES steps of sequences (their timelines).
    The runner keeps only these in memory and the report downloads only these."""
    ok = _timed(runs)
    steps = [t for t in ok if t.lengths is not None][:MAX_TIMELINES]
    chosen = {t.run_id: t for t in [*rank_panels([t for t in ok if t.world >= 2]), *steps]}
    return list(chosen.values())


def figures(runs: list[TrialView], details: dict[str, dict[str, Any]] | None = None,
            metric: str = "tokens_per_s") -> dict[str, Any]:
    """The plots these trials support: name -> matplotlib Figure. `details` (run id -> the trial's
    per_rank.json) adds the per-rank breakdown; `metric`: the sweep's headline (the winners' map).
    Past MAX_BARS trials the bar-a-trial figures become a line per configuration, so a figure's
    size follows the sweep's configurations and lengths, not its trials."""
    figs: dict[str, Any] = {}
    ok = [t for t in runs if t.finished]
    errs = [t for t in ok if "err_max" in t.metrics]
    if errs:
        figs["accuracy_vs_world"] = accuracy_figure(errs)
        ok = [t for t in ok if "err_max" not in t.metrics]  # one pass each: no timing plots
    if len({t.seq_len for t in ok if "tokens_per_s" in t.metrics}) > 1:
        figs["throughput_vs_seq_len"] = vs_seq_len(
            ok, "tokens_per_s", "throughput (band: 95% interval; hollow: unstable)", "tokens/s")
    if len({t.seq_len for t in ok if "peak_mem_bytes" in t.metrics}) > 1:
        figs["memory_vs_seq_len"] = vs_seq_len(ok, "peak_mem_bytes", "peak memory per rank",
                                               "MiB", 1 / 2**20, mark=False)
    points = scaling_points(ok)
    if points:
        figs["scaling_vs_world"] = scaling_figure(points)
    many = len([t for t in ok if t.world > 1]) > MAX_BARS
    if any(k.startswith("bytes_") for t in ok for k in t.metrics):
        if many and len({t.seq_len for t in ok}) > 1:
            figs["bytes_vs_seq_len"] = bytes_vs_seq_len(ok)
        elif not many:
            figs["bytes_by_link"] = bytes_by_link(ok)
    analytic = [t for t in ok if "bytes_analytic_per_rank" in t.metrics
                and "bytes_total" in t.metrics and t.world > 1]
    if analytic:
        if len(analytic) <= MAX_BARS:
            figs["bytes_measured_vs_analytic"] = bytes_vs_analytic(analytic)
        elif len({t.seq_len for t in analytic}) > 1:
            figs["bytes_ratio_vs_seq_len"] = bytes_ratio_vs_seq_len(analytic)
    if len(ok) > MAX_BARS:
        heat = winners_map(ok, metric)
        if heat is not None:
            figs["winners_map"] = heat
    if details:
        rate = one_rank_rate(ok)
        ordered = rank_panels([t for t in ok if t.world >= 2])
        items = [(t, parts) for t in ordered if t.run_id in details
                 for parts in [rank_breakdown(details[t.run_id], rate)] if parts]
        if items:
            figs["per_rank_breakdown"] = per_rank_figure(items[:MAX_RANK_PANELS], rate is not None)
    docs = [t for t in ok if t.documents is not None and "load_imbalance" in t.metrics]
    if docs:
        figs["varlen_balance"] = varlen_figure(docs)
    if any(t.window is not None for t in ok):
        savings = window_savings(ok)
        if savings:
            figs["window_savings"] = window_figure(savings)
    train = [t for t in ok if t.training is not None]
    if train:  # model training trials: what each configuration keeps and what it costs
        figs["train_memory_and_time"] = train_figure(train)
    steps = [t for t in ok if t.lengths is not None]
    if steps:  # steps of sequences dealt by an SP policy
        figs["sp_policies"] = policies_figure(steps)
        spread = distribution_figure(steps[0].lengths, steps[0].seq_len)
        if spread is not None:
            figs["length_distribution"] = spread
        timelines = [(t, ranks) for t in steps for ranks in [timeline_of(details, t)] if ranks]
        if timelines:
            figs["step_timeline"] = timeline_figure(timelines[:MAX_TIMELINES])
    return figs


def timeline_of(details: dict[str, dict[str, Any]] | None, t: TrialView) -> list | None:
    """Each rank's micro-batches of one step, from the trial's per_rank.json (None: not there)."""
    ranks = ((details or {}).get(t.run_id) or {}).get("per_rank") or []
    out = [r.get("extra", {}).get("varlen", {}).get("timeline") for r in ranks]
    return out if out and all(x is not None for x in out) else None
