"""Sliding windows against full causal: time, FLOPs and bytes as fractions, beside visible pairs."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from seqpar.algorithms import layouts
from seqpar.sweeps import style
from seqpar.sweeps.report.plots.common import line_styles, placed_label
from seqpar.sweeps.report.view import TrialView

WINDOW_METRICS = (("step_ms", "step time"), ("attn_flops", "attention FLOPs"),
                  ("bytes_total", "bytes sent"))
Saving = tuple[int, dict[str, float], TrialView]  # W, {metric: windowed / full causal}, trial


def window_savings(runs: list[TrialView]) -> dict[str, list[Saving]]:
    """label -> (W, {metric: windowed / full causal}, trial) per configuration that has both a
    full-causal run (no window) and windowed ones, sorted by W."""
    def key(t: TrialView) -> tuple:
        return (t.config, t.world, t.layout, t.seq_len, t.dtype, t.kv_heads, t.documents)

    full = {key(t): t for t in runs if t.window is None}
    out: dict[str, list[Saving]] = defaultdict(list)
    for t in runs:
        base = full.get(key(t))
        if t.window is None or base is None:
            continue
        ratios = {m: t.metrics[m] / base.metrics[m] for m, _ in WINDOW_METRICS
                  if base.metrics.get(m) and m in t.metrics}
        out[placed_label(t)].append((t.window, ratios, t))
    return {k: sorted(v, key=lambda s: s[0]) for k, v in out.items()}


def visible_fraction(seq_len: int, w: int) -> float:
    """Visible (query, key) pairs of a causal window W over causal attention, one document
    (`layouts.Relation.pairs`: the relation's own count)."""
    import torch  # only when a window figure is drawn: `seqpar compare` stays light

    t = torch.arange(seq_len)
    return layouts.Relation(True, None, w).pairs(t, t) / layouts.Relation(True).pairs(t, t)


def window_figure(savings: dict[str, list[Saving]]) -> Any:
    """Step time, FLOPs and bytes of each window as a fraction of full causal, against W, with
    the visible-pair fraction (what a kernel that skips everything invisible needs)."""
    fig, axes = style.new_figure(13, 4.3, ncols=len(WINDOW_METRICS))
    styles = line_styles(sorted(savings))
    windows = sorted({w for pts in savings.values() for w, _, _ in pts})
    lengths = sorted({t.seq_len for pts in savings.values() for _, _, t in pts})
    for ax, (metric, title) in zip(axes[0], WINDOW_METRICS, strict=True):
        for label in sorted(savings):
            pts = [(w, ratios[metric]) for w, ratios, _ in savings[label] if metric in ratios]
            if pts:
                ax.plot([w for w, _ in pts], [v for _, v in pts], marker="o", ls=styles[label],
                        color=style.colour(label.split(" ")[0]), label=label)
        if len(lengths) == 1 and metric != "bytes_total":  # what the kernels cannot skip
            ax.plot(windows, [visible_fraction(lengths[0], w) for w in windows], color="k",
                    ls="--", lw=0.9, label="visible pairs / causal pairs")
        ax.axhline(1.0, color="#888888", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(windows, [style.tokens(w) for w in windows])
        ax.minorticks_off()
        ax.set(xlabel="window W (tokens)", title=f"{title}, windowed / full causal",
               ylim=(0, None))
    axes[0][0].set_ylabel("fraction of full causal (1 - saved)")
    axes[0][0].legend(fontsize=7, loc="best")
    n = f"N={style.tokens(lengths[0])}" if len(lengths) == 1 else ""
    fig.suptitle(f"sliding window against full causal {n}".strip(), fontsize=10)
    fig.tight_layout()
    return fig
