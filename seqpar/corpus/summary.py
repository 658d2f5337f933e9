"""A corpus's length distribution as the papers show it: documents, tokens, mean, p50/p90/p99/max
(numpy's percentiles, linear interpolation), and the share of the tokens and of the causal
attention work (a sequence of L tokens: L(L+1)/2 query-key pairs) in sequences longer than 4K, 32K
and 128K tokens.

    s = summarize([512, 9000, 40000])
    s.token_share[32768], s.work_share[32768]   # 0.81..., 0.95...
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

THRESHOLDS = (4096, 32768, 131072)


@dataclass(frozen=True)
class Summary:
    documents: int
    tokens: int
    mean: float
    p50: float
    p90: float
    p99: float
    max: int
    token_share: dict[int, float]  # threshold -> share of the tokens in longer sequences
    work_share: dict[int, float]   # threshold -> share of the causal attention pairs

    def profile(self) -> dict[str, Any]:
        """Flat JSON-able fields (MLflow's dataset profile, `seqpar lengths --json`)."""
        out: dict[str, Any] = {k: getattr(self, k) for k in
                               ("documents", "tokens", "mean", "p50", "p90", "p99", "max")}
        for t in THRESHOLDS:
            out[f"tokens_over_{t // 1024}k"] = self.token_share[t]
            out[f"work_over_{t // 1024}k"] = self.work_share[t]
        return out

    def lines(self) -> list[str]:
        """The summary as `seqpar lengths` prints it."""
        over = "  ".join(f">{t // 1024}K {100 * self.token_share[t]:.1f}% / "
                         f"{100 * self.work_share[t]:.1f}%" for t in THRESHOLDS)
        return [f"documents {self.documents:,}  tokens {self.tokens:,}  mean {self.mean:,.1f}",
                f"p50 {self.p50:,.0f}  p90 {self.p90:,.0f}  p99 {self.p99:,.0f}  max {self.max:,}",
                f"in sequences longer than: tokens / causal attention work  {over}"]


def summarize(lengths: Sequence[int] | np.ndarray) -> Summary:
    """The summary of positive lengths (at least one)."""
    x = np.asarray(lengths, dtype=np.int64)
    tokens = int(x.sum())
    work = x.astype(np.float64) * (x + 1) / 2
    total_work = float(work.sum())
    p50, p90, p99 = (float(v) for v in np.percentile(x, (50, 90, 99)))
    return Summary(int(x.size), tokens, tokens / x.size, p50, p90, p99, int(x.max()),
                   {t: int(x[x > t].sum()) / tokens for t in THRESHOLDS},
                   {t: float(work[x > t].sum()) / total_work for t in THRESHOLDS})
