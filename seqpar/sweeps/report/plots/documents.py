"""Packed documents: tokens/s per algorithm and layout beside equal work, and the load imbalance."""

from __future__ import annotations

import statistics
from typing import Any

from seqpar.rules.lengths import split_total
from seqpar.sweeps import style
from seqpar.sweeps.report.view import TrialView

LAYOUT_HATCH = {"contiguous": "", "zigzag": "///", "stripe": "..."}


def documents_title(t: TrialView) -> str:
    """The documents of a trial, in words: count, and the drawn lengths' range."""
    docs = t.documents
    assert docs is not None
    if docs.count is None:
        return f"N={style.tokens(t.seq_len)}, {docs.short} documents"
    lengths = split_total(t.seq_len, docs.count, float(docs.spread or 0), docs.seed or 0)
    return (f"N={style.tokens(t.seq_len)}, {docs.short}: lengths {min(lengths)}..{max(lengths)}, "
            f"longest {max(lengths) / statistics.median(lengths):.1f}x the median")


def _layout_order(t: TrialView) -> int:
    return list(LAYOUT_HATCH).index(t.layout) if t.layout in LAYOUT_HATCH else 9


def varlen_figure(runs: list[TrialView]) -> Any:
    """Per trial (algorithm x layout): tokens/s with what equal work would give, and the load
    imbalance (max/mean FLOPs over ranks) beside the ideal 1.0."""
    ts = sorted(runs, key=lambda t: (t.world > 1, t.algorithm, _layout_order(t)))
    fig, axes = style.new_figure(11, max(3.0, 0.3 * len(ts) + 1.6), ncols=2)
    a1, a2 = axes[0]
    y = list(range(len(ts)))
    colours = [style.colour(t.algorithm) for t in ts]
    hatches = [LAYOUT_HATCH.get(t.layout or "", "") for t in ts]
    tps = [t.metrics["tokens_per_s"] for t in ts]
    imb = [t.metrics["load_imbalance"] for t in ts]
    for ax, values in ((a1, tps), (a2, imb)):
        for yi, v, c, h in zip(y, values, colours, hatches, strict=True):
            ax.barh(yi, v, color=c, hatch=h, edgecolor="white", lw=0)
    a1.scatter([v * i for v, i in zip(tps, imb, strict=True)], y, marker="|", s=160, color="k",
               zorder=5, label="equal work (tokens/s x max/mean: the ranks' mean FLOPs at the "
                               "measured pace)")
    over = [(v, yi) for v, yi, t in zip(tps, y, ts, strict=True) if t.oversubscribed]
    style.mark_oversubscribed(a1, [v for v, _ in over], [yi for _, yi in over], True)
    a2.axvline(1.0, color="k", ls="--", lw=0.9, label="ideal (equal work)")
    for yi, v in zip(y, imb, strict=True):
        a2.text(v, yi, f" {v:.3f}", va="center", fontsize=7)
    a1.set_yticks(y, [f"{t.config} P={t.world} {t.layout or ''}" for t in ts], fontsize=7)
    a2.set_yticks(y, [""] * len(y))
    for ax in (a1, a2):
        ax.invert_yaxis()
    a1.set(xlabel="tokens/s", title="throughput")
    a2.set(xlabel="max / mean attention FLOPs over ranks", title="load imbalance",
           xlim=(0, max(imb) * 1.15))
    handles = [h for ax in (a1, a2) for h in ax.get_legend_handles_labels()[0]]
    labels = [lab for ax in (a1, a2) for lab in ax.get_legend_handles_labels()[1]]
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=7)  # the bars fill the panels
    fig.suptitle(f"packed documents, {documents_title(ts[0])} (hatch: layout; contiguous "
                 "plain, zigzag ///, stripe ...)", fontsize=9)
    fig.tight_layout(rect=(0, 0.45 / fig.get_figheight(), 1, 1))
    return fig
