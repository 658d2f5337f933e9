"""Figures of a long sweep, whose size follows its groups, not its trials: bytes against sequence
length one line per configuration (instead of a bar a trial), the ledger over the formula the same
way, and a map of the winners where two of the sweep's axes vary."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from seqpar.experiments.registry import higher_is_better
from seqpar.sweeps import style
from seqpar.sweeps.report.plots.common import line_styles, placed_label
from seqpar.sweeps.report.view import TrialView

MAX_BARS = 24  # a bar a trial up to this many trials; past it, a line per configuration


def _lines(ts: list[TrialView]) -> dict[str, list[TrialView]]:
    """Trials by configuration at its world and layout, each sorted by length."""
    out: dict[str, list[TrialView]] = defaultdict(list)
    for t in ts:
        out[placed_label(t) + (f" Hkv={t.kv_heads}" if t.gqa else "")].append(t)
    return {k: sorted(v, key=lambda t: t.seq_len) for k, v in sorted(out.items())}


def bytes_vs_seq_len(ok: list[TrialView]) -> Any:
    """MB the whole gang sends per step against N, a line per configuration (dashed: inter)."""
    fig, axes = style.new_figure()
    ax = axes[0][0]
    lines = _lines([t for t in ok if t.world > 1 and "bytes_total" in t.metrics])
    styles = line_styles(list(lines))
    for label, ts in lines.items():
        c = style.colour(ts[0].algorithm)
        xs = [t.seq_len for t in ts]
        ax.plot(xs, [t.metrics["bytes_total"] / 1e6 for t in ts], color=c, ls=styles[label],
                label=label, lw=1.2)
        inter = [t.metrics.get("bytes_inter", 0) / 1e6 for t in ts]
        if any(inter):
            ax.plot(xs, inter, color=c, ls="--", lw=0.8)
    style.seq_len_axis(ax, [t.seq_len for ts in lines.values() for t in ts])
    ax.set_yscale("log")
    ax.set(ylabel="MB sent per step, all ranks", title="bytes against sequence length")
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig


def bytes_ratio_vs_seq_len(ts: list[TrialView]) -> Any:
    """One rank's measured bytes over the formula's, against N, a line per configuration."""
    fig, axes = style.new_figure(7.5, 3.5)
    ax = axes[0][0]
    lines = _lines(ts)
    styles = line_styles(list(lines))
    for label, group in lines.items():
        pts = [(t.seq_len, t.metrics["bytes_total"] / max(1, t.world)
                / t.metrics["bytes_analytic_per_rank"]) for t in group
               if t.metrics.get("bytes_analytic_per_rank")]
        if pts:
            ax.plot([x for x, _ in pts], [y for _, y in pts], color=style.colour(
                group[0].algorithm), ls=styles[label], label=label, lw=1.2)
    ax.axhline(1.0, color="k", lw=0.8, ls=":")
    style.seq_len_axis(ax, [t.seq_len for t in ts])
    ax.set(ylabel="measured / analytic bytes", title="bytes: ledger over formula (1.00: equal)")
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig


AXES = (("N", lambda t: t.seq_len), ("P", lambda t: t.world),
        ("Hkv", lambda t: t.kv_heads), ("H", lambda t: t.heads),
        ("mask", lambda t: t.mask), ("layout", lambda t: t.layout))


def varied_axes(ok: list[TrialView]) -> list[tuple[str, Any]]:
    """The axes (besides the configuration) on which the trials take more than one value."""
    return [(name, get) for name, get in AXES if len({get(t) for t in ok}) > 1]


def winners_map(ok: list[TrialView], metric: str) -> Any | None:
    """Where two axes vary: a cell per (first axis, second axis), coloured by the configuration
    that wins it (best `metric` over the rest of the axes), labelled with its lead over the
    runner-up (hidden when the cells are too many to read). None when fewer than two axes vary."""
    ranked = [t for t in ok if metric in t.metrics]
    axes = varied_axes(ranked)
    if len(axes) < 2:
        return None
    (xname, xget), (yname, yget) = axes[:2]
    cells: dict[tuple, dict[str, float]] = defaultdict(dict)
    pick = max if higher_is_better(metric) else min
    for t in ranked:
        best = cells[(xget(t), yget(t))]
        value = t.metrics[metric]
        best[t.config] = pick(value, best.get(t.config, value))
    xs = sorted({k[0] for k in cells}, key=_order)
    ys = sorted({k[1] for k in cells}, key=_order)
    configs = sorted({c for v in cells.values() for c in v})
    fig, axs = style.new_figure(max(5.0, min(14.0, 0.3 * len(xs) + 3)),
                                max(2.5, min(9.0, 0.35 * len(ys) + 1.8)))
    ax = axs[0][0]
    from matplotlib.colors import to_rgba
    from matplotlib.patches import Patch

    colours = {c: style.colour(c.split(" ")[0]) for c in configs}
    shade = {c: i % 3 for i, c in enumerate(configs)}  # same algorithm: lighter shades
    image = [[(1.0, 1.0, 1.0, 1.0)] * len(xs) for _ in ys]
    readable = len(xs) * len(ys) <= 120
    for (x, y), values in cells.items():
        ordered = sorted(values.items(), key=lambda kv: kv[1], reverse=higher_is_better(metric))
        winner, best = ordered[0]
        rgba = to_rgba(colours[winner], 1.0 - 0.3 * shade[winner])
        image[ys.index(y)][xs.index(x)] = rgba
        if readable and len(ordered) > 1 and best:
            lead = abs(best - ordered[1][1]) / abs(best)
            ax.text(xs.index(x), ys.index(y), f"{lead:.0%}", ha="center", va="center",
                    fontsize=6)
    ax.imshow(image, aspect="auto", origin="lower", interpolation="nearest")
    ax.grid(False)
    step_x = max(1, len(xs) // 12)
    ax.set_xticks(range(0, len(xs), step_x), [_tick(xname, v) for v in xs[::step_x]])
    ax.set_yticks(range(len(ys)), [_tick(yname, v) for v in ys])
    ax.set(xlabel=xname, ylabel=yname, title=f"winner by {metric} ({len(configs)} configurations)")
    ax.legend(handles=[Patch(color=to_rgba(colours[c], 1.0 - 0.3 * shade[c]), label=c)
                       for c in configs[:12]], fontsize=7, loc="upper left",
              bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig


def _order(value: Any) -> tuple:
    return (0, value, "") if isinstance(value, int | float) else (1, 0, str(value))


def _tick(name: str, value: Any) -> str:
    return style.tokens(value) if name == "N" else str(value)
