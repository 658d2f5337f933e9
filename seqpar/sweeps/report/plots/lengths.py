"""Throughput and memory against sequence length, one line per configuration, the 95% interval as
a band, unstable trials hollow; a line of more than MARKED points (a long sweep's) is drawn without
markers, hollow or crossed (the table counts its unstable and oversubscribed trials)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from seqpar.sweeps import style
from seqpar.sweeps.report.plots.common import band, line_styles, mark_unstable
from seqpar.sweeps.report.view import TrialView

MARKED = 30  # points a line may mark one by one


def _series_label(t: TrialView) -> str:
    label = f"{t.config} P={t.world}"
    if t.gqa:
        label += f" Hkv={t.kv_heads}"
    if t.mask_spec:
        label += f" {t.mask_spec[:40]}"
    return label


def vs_seq_len(ok: list[TrialView], metric: str, title: str, ylabel: str,
               scale: float = 1.0, mark: bool = True) -> Any:
    fig, axes = style.new_figure()
    ax = axes[0][0]
    groups: dict[str, list[TrialView]] = defaultdict(list)
    for t in ok:
        if metric in t.metrics:
            groups[_series_label(t)].append(t)
    styles = line_styles(sorted(groups))
    flagged = hollow = False
    for label in sorted(groups):
        ts = sorted(groups[label], key=lambda t: t.seq_len)
        xs = [t.seq_len for t in ts]
        ys = [t.metrics[metric] * scale for t in ts]
        c = style.colour(ts[0].algorithm)
        dense = len(ts) > MARKED
        ax.plot(xs, ys, marker=None if dense else "o", ls=styles[label], color=c, label=label,
                lw=1.0 if dense else 1.5)
        bands = [band(t, metric) for t in ts]
        if all(b is not None for b in bands) and len(ts) > 1:
            ax.fill_between(xs, [b[0] * scale for b in bands], [b[1] * scale for b in bands],
                            color=c, alpha=0.15, lw=0)
        if mark and not dense:
            shaky = mark_unstable(ax, list(zip(xs, ys, ts, strict=True)), c, not hollow)
            hollow = hollow or shaky
        over = [(x, y) for x, y, t in zip(xs, ys, ts, strict=True)
                if mark and not dense and t.oversubscribed]
        style.mark_oversubscribed(ax, [x for x, _ in over], [y for _, y in over], not flagged)
        flagged = flagged or bool(over)
    style.seq_len_axis(ax, [t.seq_len for t in ok])
    ax.set(ylabel=ylabel, title=title)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig
