"""Bytes on the wire: each trial's gang by link (intra / inter node), and one rank's bytes measured
by the ledger beside the algorithm's analytic count."""

from __future__ import annotations

from typing import Any

from seqpar.sweeps import style
from seqpar.sweeps.report.plots.common import trial_label
from seqpar.sweeps.report.view import TrialView


def bytes_by_link(ok: list[TrialView]) -> Any:
    """Horizontal bars (readable labels): MB each trial's gang sends per step, by link."""
    ts = [t for t in ok if t.world > 1] or ok
    fig, axes = style.new_figure(8, max(2.5, 0.32 * len(ts) + 1.2))
    ax = axes[0][0]
    intra = [t.metrics.get("bytes_intra", 0) / 1e6 for t in ts]
    inter = [t.metrics.get("bytes_inter", 0) / 1e6 for t in ts]
    y = list(range(len(ts)))
    colours = [style.colour(t.algorithm) for t in ts]
    ax.barh(y, intra, color=colours, label="intra-node")
    if any(inter):
        ax.barh(y, inter, left=intra, color=colours, hatch="///", edgecolor="white",
                label="inter-node (hatched)")
    ax.set_yticks(y, [trial_label(t) for t in ts], fontsize=7)
    ax.invert_yaxis()
    ax.set(xlabel="MB sent per step, all ranks", title="bytes by link")
    if any(inter):
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def bytes_vs_analytic(ts: list[TrialView]) -> Any:
    """Per rank and step: the ledger's measured bytes (mean over ranks) beside the algorithm's
    analytic count; a ratio other than 1.00 is a booking or formula error worth a look."""
    fig, axes = style.new_figure(8, max(2.5, 0.45 * len(ts) + 1.2))
    ax = axes[0][0]
    y = list(range(len(ts)))
    measured = [t.metrics["bytes_total"] / max(1, t.world) / 1e6 for t in ts]
    analytic = [t.metrics["bytes_analytic_per_rank"] / 1e6 for t in ts]
    colours = [style.colour(t.algorithm) for t in ts]
    ax.barh([v - 0.2 for v in y], measured, height=0.4, color=colours, label="measured (ledger)")
    ax.barh([v + 0.2 for v in y], analytic, height=0.4, color=colours, alpha=0.35,
            hatch="..", edgecolor="k", lw=0.3, label="analytic (formula)")
    for i, (m, a) in enumerate(zip(measured, analytic, strict=True)):
        ax.text(max(m, a), i, f"  {m / a:.2f}x" if a else "  -", va="center", fontsize=7)
    ax.set_yticks(y, [trial_label(t) for t in ts], fontsize=7)
    ax.invert_yaxis()
    ax.set(xlabel="MB one rank sends per step", title="bytes: measured vs analytic (ratio)")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig
