"""What several figure families share: series labels, line styles, the interval band, the hollow
marker of an unstable trial."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from seqpar.sweeps import style
from seqpar.sweeps.report.view import TrialView


def band(t: TrialView, metric: str) -> tuple[float, float] | None:
    """The 95% confidence interval of a metric's median over the timed iterations, from the step
    time's interval (runs logged before intervals: the p10-p90 spread)."""
    m = t.metrics
    lo, hi = ("step_ms_ci_low", "step_ms_ci_high") if "step_ms_ci_low" in m else (
        "step_ms_p10", "step_ms_p90")
    if lo not in m or hi not in m or "step_ms" not in m:
        return None
    if metric == "step_ms":
        return m[lo], m[hi]
    if metric in ("tokens_per_s", "tokens_per_s_per_rank") and metric in m and m[lo] > 0:
        work = m[metric] * m["step_ms"]  # tokens (per rank) x ms: constant over iterations
        return work / m[hi], work / m[lo]
    return None


UNSTABLE_LABEL = "unstable (hollow: wide interval or busy host)"


def mark_unstable(ax: Any, points: list[tuple[float, float, TrialView]], colour: str,
                  label: bool) -> bool:
    """Hollow markers over the points of unstable trials (the line's filled ones stay for the
    stable); returns whether any was drawn."""
    shaky = [(x, y) for x, y, t in points if t.unstable]
    if shaky:
        ax.scatter([x for x, _ in shaky], [y for _, y in shaky], s=60, facecolors="white",
                   edgecolors=colour, linewidths=1.5, zorder=4,
                   label=UNSTABLE_LABEL if label else None)
    return bool(shaky)


def line_styles(labels: list[str]) -> dict[str, str]:
    """Same algorithm, same colour; its second, third... series get dashed/dotted lines."""
    seen: dict[str, int] = defaultdict(int)
    out = {}
    for label in labels:
        algo = label.split(" ")[0]
        out[label] = ("-", "--", ":", "-.")[seen[algo] % 4]
        seen[algo] += 1
    return out


def trial_label(t: TrialView) -> str:
    """One trial in a bar chart's row: 'ring  P=4 zigzag N=4K Hkv=2 [oversub]' (and any mask's
    compact form: trials of a mask sweep differ by it)."""
    return (f"{t.config}  P={t.world} {t.layout or ''} N={style.tokens(t.seq_len)}"
            + (f" Hkv={t.kv_heads}" if t.gqa else "")
            + (f" {t.mask_spec[:40]}" if t.mask_spec else "")
            + ("  [oversub]" if t.oversubscribed else ""))


def placed_label(t: TrialView) -> str:
    """A configuration at its world and layout: 'ring P=4 zigzag'."""
    return f"{t.config} P={t.world} {t.layout or ''}"
