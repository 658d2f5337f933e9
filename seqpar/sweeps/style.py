"""One look for every seqpar plot: a colour per algorithm (the same in every figure), sequence
lengths as 2K/128K/1M, integer ticks for world sizes, and a mark for oversubscribed points."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from typing import Any

# a fixed colour per algorithm (colour-blind-safe Okabe-Ito order), so "ring" is the same blue in
# the throughput, scaling, bytes and per-rank plots of every sweep
ALGORITHM_COLOURS = {
    "local": "#000000", "allgather": "#E69F00", "ulysses": "#56B4E9", "ring": "#0072B2",
    "usp": "#009E73", "double_ring": "#D55E00", "wallfacer": "#CC79A7", "burst": "#F0E442",
}
EXTRA = ("#999999", "#882255", "#44AA99", "#117733", "#332288", "#AA4499")
PHASE_COLOURS = {"compute": "#0072B2", "waiting": "#BBBBBB", "communication": "#D55E00"}
OVERSUBSCRIBED_MARKER = dict(marker="x", s=70, color="#CC0000", zorder=5, linewidths=1.8)
OVERSUBSCRIBED_LABEL = "oversubscribed (ranks > cores)"


def colour(algorithm: str) -> str:
    """The algorithm's colour; an unknown name gets a stable one from its hash."""
    if algorithm in ALGORITHM_COLOURS:
        return ALGORITHM_COLOURS[algorithm]
    return EXTRA[int(hashlib.sha1(algorithm.encode()).hexdigest(), 16) % len(EXTRA)]


def tokens(n: float) -> str:
    """2048 -> '2K', 131072 -> '128K', 1048576 -> '1M', 1536 -> '1.5K'."""
    n = int(n)
    for unit, size in (("M", 2**20), ("K", 2**10)):
        if n >= size:
            value = n / size
            return f"{value:g}{unit}" if value == int(value) else f"{value:.1f}{unit}"
    return str(n)


MAX_TICKS = 10


def seq_len_axis(ax: Any, values: list[int]) -> None:
    """A log2 x axis ticked at the sequence lengths measured (at most MAX_TICKS of them, evenly
    spread), labelled 2K/4K/..."""
    ticks = sorted(set(values))
    if len(ticks) > MAX_TICKS:  # a long sweep's lengths: the measured ones nearest to evenly
        lo, hi = math.log2(ticks[0]), math.log2(ticks[-1])
        wanted = [2 ** (lo + (hi - lo) * i / (MAX_TICKS - 1)) for i in range(MAX_TICKS)]
        ticks = sorted({min(ticks, key=lambda v, w=w: abs(math.log2(v / w))) for w in wanted})
        # (spread points of the log axis: the labels stay apart)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [tokens(v) for v in ticks])
    ax.minorticks_off()
    ax.set_xlabel("sequence length (tokens)")


def world_axis(ax: Any, worlds: list[int]) -> None:
    """Ticks at the world sizes measured, integers only."""
    ticks = sorted(set(worlds))
    ax.set_xticks(ticks, [str(w) for w in ticks])
    ax.minorticks_off()
    ax.set_xlabel("world (ranks)")


def decades(values: list[float]) -> tuple[float, float]:
    """Log-axis limits at whole decades around the positive values, so that every log panel shows
    at least one labelled tick (and panels of a row can share them)."""
    import math

    positive = [v for v in values if v > 0] or [1.0]
    lo = math.floor(math.log10(min(positive)))
    hi = max(math.ceil(math.log10(max(positive))), lo + 1)
    return 10.0 ** lo, 10.0 ** hi


def new_figure(width: float = 7.5, height: float = 4.5, ncols: int = 1, nrows: int = 1,
               sharey: bool = False) -> Any:
    """A figure in the house style and its axes as a 2-D grid (`axes[row][col]`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False,
                         "axes.spines.right": False, "legend.frameon": False, "font.size": 9})
    return plt.subplots(nrows, ncols, figsize=(width, height), squeeze=False,
                        sharey=sharey)


def mark_oversubscribed(ax: Any, xs: list[float], ys: list[float], label: bool) -> None:
    if xs:
        ax.scatter(xs, ys, label=OVERSUBSCRIBED_LABEL if label else None,
                   **OVERSUBSCRIBED_MARKER)


def close(figures: Iterable[Any]) -> None:
    """Free the figures (pyplot keeps every open one alive)."""
    import matplotlib.pyplot as plt

    for fig in figures:
        plt.close(fig)
