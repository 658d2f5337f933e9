"""Model-training trials: what each configuration keeps for backward, its peak, and its step time."""

from __future__ import annotations

from typing import Any

from seqpar.sweeps import style
from seqpar.sweeps.report.view import TrialView


def train_figure(runs: list[TrialView]) -> Any:
    """Activation and peak bytes, and step time, per training configuration (horizontal bars)."""
    labels = [f"{t.config} N={t.seq_len}" for t in runs]
    fig, axes = style.new_figure(12, max(3.0, 0.35 * len(runs) + 1.5), ncols=2, sharey=True)
    a1, a2 = axes[0]
    y = range(len(runs))
    a1.barh([i + 0.2 for i in y], [t.metrics.get("peak_mem_bytes", 0) / 2**20 for t in runs],
            height=0.4, label="peak (RSS high-water)")
    a1.barh([i - 0.2 for i in y], [t.metrics.get("activation_bytes", 0) / 2**20 for t in runs],
            height=0.4, label="kept for backward")
    a1.set(xlabel="MiB per rank", title="memory")
    a1.set_yticks(list(y), labels, fontsize=6)
    a1.legend(fontsize=7)
    ms = [t.metrics.get("step_ms", 0) for t in runs]
    err = [[max(0.0, v - (t.interval or (v, v))[0]) for v, t in zip(ms, runs, strict=True)],
           [max(0.0, (t.interval or (v, v))[1] - v) for v, t in zip(ms, runs, strict=True)]]
    bars = a2.barh(list(y), ms, xerr=err, capsize=2)
    for bar, t in zip(bars, runs, strict=True):
        if t.unstable:  # hollow: its time cannot be trusted
            bar.set(facecolor="white", edgecolor=bar.get_facecolor(), hatch="//")
    a2.set(xlabel="step ms (slowest rank, median; 95% interval; hollow: unstable)", title="time")
    fig.tight_layout()
    return fig
