"""Relative error against a float64 single-process reference, by world size, dtype and tensor."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from seqpar.sweeps import style
from seqpar.sweeps.report.view import TrialView

TENSORS = ("out", "dq", "dk", "dv")
DTYPE_ORDER = ("float64", "float32", "float16", "bfloat16")


def accuracy_series(runs: list[TrialView]) -> dict[tuple[str, str], list[tuple[int, TrialView]]]:
    """(dtype, algorithm) -> (world, trial) sorted by world; the one-process kernel (`local`, world
    1) starts every algorithm's series of its dtype: world 1 is where every algorithm begins."""
    local = {t.dtype or "": t for t in runs if t.algorithm == "local"}
    out: dict[tuple[str, str], dict[int, TrialView]] = defaultdict(dict)
    for t in runs:
        if t.algorithm == "local":
            continue
        dt = t.dtype or ""
        key = (dt, t.algorithm)
        if t.world not in out[key] or t.metrics["err_max"] > out[key][t.world].metrics["err_max"]:
            out[key][t.world] = t  # two configurations at one world: the worse one
        if dt in local:
            out[key].setdefault(1, local[dt])
    return {k: sorted(v.items(), key=lambda pt: pt[0]) for k, v in out.items()}


def accuracy_figure(runs: list[TrialView]) -> Any:
    """Relative error against float64 vs world size, one line per algorithm: a row per dtype, a
    column per tensor (out, dq, dk, dv)."""
    dtypes = sorted({t.dtype or "" for t in runs},
                    key=lambda d: DTYPE_ORDER.index(d) if d in DTYPE_ORDER else 9)
    series = accuracy_series(runs)
    fig, axes = style.new_figure(3.2 * len(TENSORS), 3.0 * len(dtypes) + 0.9, ncols=len(TENSORS),
                                 nrows=len(dtypes))
    worlds = sorted({t.world for t in runs})
    for i, dt in enumerate(dtypes):
        row_limits = style.decades([t.metrics[f"err_{n}"] for t in runs for n in TENSORS
                                    if t.dtype == dt])
        for j, name in enumerate(TENSORS):
            ax = axes[i][j]
            for (d, algo), pts in sorted(series.items()):
                if d != dt:
                    continue
                ax.plot([p for p, _ in pts], [t.metrics[f"err_{name}"] for _, t in pts],
                        marker="o", ms=3.5, color=style.colour(algo), label=algo)
            base = [t for t in runs if t.algorithm == "local" and t.dtype == dt]
            if base:
                ax.scatter([1], [base[0].metrics[f"err_{name}"]], marker="*", s=110, zorder=5,
                           color=style.colour("local"), label="local (one process)")
            ax.set_yscale("log")
            ax.set_ylim(*row_limits)
            style.world_axis(ax, worlds)
            ax.set_title(f"{name}, {dt}", fontsize=9)
            if j == 0:
                ax.set_ylabel("max |x - ref| / max |ref|")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.suptitle("error against a float64 single-process reference on the same inputs "
                 "(fixed seed), by world size", fontsize=10, y=0.995)
    fig.legend(handles, labels, loc="upper center", ncol=min(8, len(labels)), fontsize=8,
               bbox_to_anchor=(0.5, 0.965))
    fig.tight_layout(rect=(0, 0, 1, 0.91))
    return fig
