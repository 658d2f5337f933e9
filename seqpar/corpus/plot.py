"""A corpus's length distribution drawn as the papers draw it, against length on a log axis: the
share of documents and of tokens at each length (left) and the share of the causal attention work
(right, with its cumulative share), the 4K/32K/128K marks on both."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

import numpy as np

from seqpar.corpus.summary import THRESHOLDS


def figure(lengths: Sequence[int] | np.ndarray, title: str = "") -> object:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = np.asarray(lengths, dtype=np.int64)
    edges = np.unique(np.round(np.logspace(0, np.log2(x.max()) + 0.25, 60, base=2)))
    edges = np.append(edges, edges[-1] + 1)
    work = x.astype(np.float64) * (x + 1) / 2
    shares = {name: np.histogram(x, bins=edges, weights=w)[0] / w.sum()
              for name, w in (("documents", np.ones(x.size)), ("tokens", x.astype(np.float64)),
                              ("attention work", work))}
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8), constrained_layout=True)
    for name, color in (("documents", "#4c72b0"), ("tokens", "#dd8452")):
        left.stairs(shares[name], edges, label=name, color=color, linewidth=1.6)
    right.stairs(shares["attention work"], edges, label="attention work", color="#c44e52",
                 fill=True, alpha=0.5)
    cumulative = right.twinx()
    cumulative.plot(edges[1:], np.cumsum(shares["attention work"]), color="#55a868",
                    label="cumulative work")
    cumulative.set_ylim(0, 1.02)
    cumulative.set_ylabel("cumulative share of the work")
    for ax, label in ((left, "share at this length"), (right, "share of causal attention work")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length (tokens)")
        ax.set_ylabel(label)
        for t in THRESHOLDS:
            if t <= edges[-1]:
                ax.axvline(t, color="grey", linestyle=":", linewidth=1)
                ax.text(t, ax.get_ylim()[1] * 0.95, f" {t // 1024}K", color="grey", fontsize=8)
    left.legend(loc="upper left", fontsize=8)
    right.legend(loc="upper left", fontsize=8)
    fig.suptitle(title or f"{x.size:,} documents, {int(x.sum()):,} tokens", fontsize=10)
    return fig


def save(lengths: Sequence[int] | np.ndarray, path: str | Path | BinaryIO, title: str = "",
         fmt: str | None = None) -> None:
    """The figure written to `path` (a file name's suffix picks the format, else `fmt`: png,
    svg, pdf)."""
    import matplotlib.pyplot as plt

    fig = figure(lengths, title)
    try:
        fig.savefig(path, dpi=120, format=fmt)  # type: ignore[attr-defined]
    finally:
        plt.close(fig)  # type: ignore[arg-type]
