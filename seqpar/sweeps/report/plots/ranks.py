"""Each rank's median step split into compute, waiting (load imbalance) and exposed communication."""

from __future__ import annotations

import statistics
from typing import Any

from seqpar.sweeps import style
from seqpar.sweeps.report.plots.common import trial_label
from seqpar.sweeps.report.view import TrialView

PHASES = ("compute", "waiting", "communication")


def rank_breakdown(detail: dict[str, Any], rate: float | None) -> list[dict[str, float]] | None:
    """Each rank's median step split into compute, waiting and (exposed) communication.

    The ranks record their time per step and their attention FLOPs, not a timeline, so the split
    is a model: compute = the rank's FLOPs at `rate` (the one-rank FLOP/s measured in this sweep,
    else the fastest rank's FLOPs/step); waiting = the busiest rank's compute minus this rank's
    (load imbalance); communication = what is left of the step (exposed communication)."""
    ranks = detail.get("per_rank") or []
    if len(ranks) < 2:
        return None
    steps = [statistics.median(m["step_ms"]) / 1e3 for m in ranks]
    flops = [sum(m.get("flops", {}).values()) for m in ranks]
    if not any(flops):
        return None
    rate = rate or max(f / s for f, s in zip(flops, steps, strict=True) if s > 0)
    compute = [f / rate for f in flops]
    busiest = max(compute)
    out = []
    for step, c in zip(steps, compute, strict=True):
        c = min(c, step)
        wait = min(busiest - c, step - c)
        out.append({"step": step * 1e3, "compute": c * 1e3, "waiting": wait * 1e3,
                    "communication": max(0.0, step - c - wait) * 1e3})
    return out


def one_rank_rate(ok: list[TrialView]) -> float | None:
    """FLOP/s of the sweep's one-rank runs (median), the rate compute is measured against."""
    rates = [t.metrics["attn_tflops"] * 1e12 for t in ok
             if t.world == 1 and t.metrics.get("attn_tflops")]
    return statistics.median(rates) if rates else None


def per_rank_figure(items: list[tuple[TrialView, list[dict[str, float]]]], one_rank: bool) -> Any:
    n = len(items)
    cols = min(3, n)
    rows = (n + cols - 1) // cols
    fig, axes = style.new_figure(4.2 * cols, 3.0 * rows + 0.6, ncols=cols, nrows=rows)
    for i, (t, parts) in enumerate(items):
        ax = axes[i // cols][i % cols]
        x = list(range(len(parts)))
        bottom = [0.0] * len(parts)
        for phase in PHASES:
            vals = [p[phase] for p in parts]
            ax.bar(x, vals, bottom=bottom, color=style.PHASE_COLOURS[phase],
                   label=phase if i == 0 else None, width=0.7)
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
        ax.set_xticks(x, [str(v) for v in x])
        ax.set_title(trial_label(t), fontsize=8, color=style.colour(t.algorithm))
        ax.set(xlabel="rank", ylabel="ms per step")
    for j in range(n, rows * cols):
        axes[j // cols][j % cols].set_visible(False)
    rate = ("the one-rank rate" if one_rank
            else "its trial's fastest rank's rate (no one-rank run in this sweep)")
    fig.suptitle(f"each rank's median step: compute (its FLOPs at {rate}), waiting (load "
                 "imbalance), communication (the rest, exposed)", fontsize=9, y=0.99)
    fig.legend(loc="upper center", ncol=3, fontsize=8, bbox_to_anchor=(0.5, 0.955))
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    return fig
