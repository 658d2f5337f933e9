"""What several figure families share: series labels, line styles, the p10-p90 band."""

from __future__ import annotations

from collections import defaultdict

from seqpar.sweeps import style
from seqpar.sweeps.report.view import Trial


def band(t: Trial, metric: str) -> tuple[float, float] | None:
    """The p10-p90 spread of a metric over the timed iterations (from the step-time spread)."""
    m = t.metrics
    if "step_ms_p10" not in m or "step_ms_p90" not in m or "step_ms" not in m:
        return None
    if metric == "step_ms":
        return m["step_ms_p10"], m["step_ms_p90"]
    if metric in ("tokens_per_s", "tokens_per_s_per_rank") and metric in m:
        work = m[metric] * m["step_ms"]  # tokens (per rank) x ms: constant over iterations
        return work / m["step_ms_p90"], work / m["step_ms_p10"]
    return None


def line_styles(labels: list[str]) -> dict[str, str]:
    """Same algorithm, same colour; its second, third... series get dashed/dotted lines."""
    seen: dict[str, int] = defaultdict(int)
    out = {}
    for label in labels:
        algo = label.split(" ")[0]
        out[label] = ("-", "--", ":", "-.")[seen[algo] % 4]
        seen[algo] += 1
    return out


def trial_label(t: Trial) -> str:
    """One trial in a bar chart's row: 'ring  P=4 zigzag N=4K Hkv=2 [oversub]'."""
    return (f"{t.config}  P={t.world} {t.layout or ''} N={style.tokens(t.seq_len)}"
            + (f" Hkv={t.kv_heads}" if t.gqa else "")
            + ("  [oversub]" if t.oversubscribed else ""))


def placed_label(t: Trial) -> str:
    """A configuration at its world and layout: 'ring P=4 zigzag'."""
    return f"{t.config} P={t.world} {t.layout or ''}"
