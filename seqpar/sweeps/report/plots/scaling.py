"""Speed-up and parallel efficiency against world size, over a one-rank run (strong and weak)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from seqpar.sweeps import style
from seqpar.sweeps.report.plots.common import band, line_styles, mark_unstable
from seqpar.sweeps.report.view import TrialView

Point = tuple[int, float, TrialView, float]  # world, speed-up, trial, baseline tokens/s


def scaling_points(ok: list[TrialView]) -> dict[str, list[Point]]:
    """label -> (world, speed-up, trial, baseline tokens/s) per configuration and length."""
    base: dict[int, float] = {}
    for t in ok:
        if t.world == 1 and (t.seq_len not in base or t.algorithm == "local"):
            base[t.seq_len] = t.metrics["tokens_per_s"]
    series: dict[str, list[Point]] = defaultdict(list)
    for t in ok:
        p, n = t.world, t.seq_len
        tps = t.metrics["tokens_per_s"]
        if n in base:
            series[f"{t.config} N={n}"].append((p, tps / base[n], t, base[n]))
        if p and n % p == 0 and n // p in base and (p == 1 or n not in base):
            series[f"{t.config} N/P={n // p}"].append((p, tps / base[n // p], t, base[n // p]))
    return {k: sorted(v, key=lambda pt: pt[0]) for k, v in series.items()
            if len({pt[0] for pt in v}) >= 2}


def scaling_series(ok: list[TrialView]) -> dict[str, list[tuple[int, float]]]:
    """Speed-up over a one-rank run (local preferred) per configuration: against the run at the
    same N (strong scaling) or at N/P (weak scaling); only series with two world sizes or more."""
    return {k: [(p, s) for p, s, _, _ in v] for k, v in scaling_points(ok).items()}


def scaling_figure(points: dict[str, list[Point]]) -> Any:
    fig, axes = style.new_figure(11, 4.5, ncols=2)
    a1, a2 = axes[0]
    worlds = sorted({p for pts in points.values() for p, *_ in pts})
    a1.plot(worlds, worlds, color="k", ls="--", lw=0.8, label="ideal (speed-up = world)")
    a2.axhline(1.0, color="k", ls="--", lw=0.8, label="ideal")
    styles = line_styles(sorted(points))
    flagged = hollow = False
    for label in sorted(points):
        pts = points[label]
        c, ls = style.colour(label.split(" ")[0]), styles[label]
        ps = [p for p, *_ in pts]
        a1.plot(ps, [s for _, s, _, _ in pts], marker="o", color=c, ls=ls, label=label)
        a2.plot(ps, [s / p for p, s, _, _ in pts], marker="o", color=c, ls=ls, label=label)
        bands = [band(t, "tokens_per_s") for _, _, t, _ in pts]
        if all(b is not None for b in bands):
            lo = [b[0] / base for b, (_, _, _, base) in zip(bands, pts, strict=True)]
            hi = [b[1] / base for b, (_, _, _, base) in zip(bands, pts, strict=True)]
            a1.fill_between(ps, lo, hi, color=c, alpha=0.15, lw=0)
            a2.fill_between(ps, [v / p for v, p in zip(lo, ps, strict=True)],
                            [v / p for v, p in zip(hi, ps, strict=True)], color=c, alpha=0.15, lw=0)
        hollow = mark_unstable(a1, [(p, s, t) for p, s, t, _ in pts], c, not hollow) or hollow
        mark_unstable(a2, [(p, s / p, t) for p, s, t, _ in pts], c, False)
        over = [(p, s) for p, s, t, _ in pts if t.oversubscribed]
        style.mark_oversubscribed(a1, [p for p, _ in over], [s for _, s in over], not flagged)
        style.mark_oversubscribed(a2, [p for p, _ in over], [s / p for p, s in over], False)
        flagged = flagged or bool(over)
    for ax in (a1, a2):
        style.world_axis(ax, worlds)
    a1.set(ylabel="speed-up over one rank (band: 95% interval)", title="speed-up")
    a2.set(ylabel="efficiency = speed-up / world", title="parallel efficiency", ylim=(0, None))
    a1.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig
