"""The classic relations, where every query sees one contiguous range of keys: causal or full,
inside its document (cu: the global boundaries, None for one document), within a window (None:
unbounded). With a window W a causal query t sees keys t-W+1..t, a full one keys s with |t-s| < W,
always inside its document. Positions at or past N = cu[-1] (padding) see nothing and are seen by
nothing.

These are the masks `masks.causal`, `masks.documents` and `masks.sliding_window` make; a `Mask`
of those kinds carries its `Relation`, and the block planner takes the relation's fast path
(`blocks.block_tasks`). Hashable: plans are cached on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

FAR = 2 ** 62  # an unbounded key edge


@dataclass(frozen=True)
class Relation:
    causal: bool = True
    cu: tuple[int, ...] | None = None
    window: int | None = None

    @property
    def plain(self) -> bool:
        """One document, no window: the classic full or causal relation."""
        return self.cu is None and self.window is None

    @property
    def full(self) -> bool:
        return self.plain and not self.causal

    def visible(self, q_pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(first, last) visible key position per query, inclusive (last < first: none)."""
        q = np.asarray(q_pos, dtype=np.int64)
        if self.cu is None:
            start = np.zeros_like(q)
            end = np.full_like(q, FAR)
        else:  # padding positions (>= N) see nothing: first > last
            cu = np.asarray(self.cu, dtype=np.int64)
            doc = np.minimum(np.searchsorted(cu, q, side="right") - 1, len(cu) - 2)
            pad = q >= cu[-1]
            start = np.where(pad, q + 1, cu[doc])
            end = np.where(pad, -1, cu[doc + 1] - 1)
        last = np.minimum(end, q) if self.causal else end
        first = start
        if self.window is not None:
            first = np.maximum(start, q - self.window + 1)
            if not self.causal:
                last = np.minimum(last, q + self.window - 1)
        return first, last

    def ranges(self, q_pos: np.ndarray, k_pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per query, the visible key indices [lo, hi) in sorted k_pos."""
        first, last = self.visible(q_pos)
        k = np.asarray(k_pos, dtype=np.int64)
        lo = np.searchsorted(k, first, side="left")
        hi = np.searchsorted(k, last, side="right")
        return lo, np.maximum(hi, lo)

    def pairs(self, q_pos: np.ndarray, k_pos: np.ndarray) -> int:
        """How many (query, key) pairs are visible (k_pos sorted)."""
        lo, hi = self.ranges(q_pos, k_pos)
        return int((hi - lo).sum())

    def row_counts(self, n: int) -> np.ndarray:
        """Visible keys of every query row 0..n-1 among keys 0..n-1."""
        first, last = self.visible(np.arange(n))
        return np.maximum(np.minimum(last, n - 1) - first + 1, 0)


def as_relation(relation: Any) -> Any:
    """A relation from True/False (plain causal/full); a relation or a mask as it is."""
    return Relation(relation) if isinstance(relation, bool) else relation
