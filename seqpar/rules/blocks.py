"""Which (query, key) blocks a mask keeps, as kernel calls: the block planner, no torch.

Every rank's token positions are sorted, so under any mask a query row of a block sees, per slice
of the mask, one contiguous range of the block's key indices [lo, hi). `block_tasks` cuts the rows
into runs where lo and hi each stay put or step by one per row and emits one or two kernel calls per
run with the masks the kernels know: 'full', 'causal' (top-left aligned square: hi steps), 'shifted'
(query i sees keys j < i: the stripe layout's block above the diagonal) and 'band' (lo steps: a
window's lower edge; the kernel takes the band's two diagonal offsets). Rows and blocks no query can
see get no call at all. This is the one place block relations live; algorithms never special-case a
layout or a mask.

Two paths: a classic `Relation` (causal / full / documents / window: one key range per row) plans
from its ranges directly; any other `masks.Mask` plans slice by slice, its calls for one row adding
up by the online softmax (slices never share a pair). `sees` and `layout_need` say which rank pairs
see each other at all, from which the ring schedules skip transfers (`route`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from seqpar.rules import layouts
from seqpar.rules.masks import Mask
from seqpar.rules.relation import Relation, as_relation

Need = tuple[tuple[bool, ...], ...]


@dataclass(frozen=True)
class Task:
    """One kernel call: queries [q0, q1) against keys [k0, k1) under `mask`. For mask 'band', row i
    of the block sees the block's keys j with band[0] <= j - i < band[1]."""

    q0: int
    q1: int
    k0: int
    k1: int
    mask: str
    band: tuple[int, int] | None = None

    @property
    def pairs(self) -> int:
        """Visible (query, key) pairs of this call."""
        sq, sk = self.q1 - self.q0, self.k1 - self.k0
        if self.mask == "full":
            return sq * sk
        i = np.arange(sq)
        lo, hi = {"causal": (0 * i, i + 1), "shifted": (0 * i, i)}.get(
            self.mask, (i + (self.band or (0, 0))[0], i + (self.band or (0, 0))[1]))
        return int(np.maximum(np.clip(hi, 0, sk) - np.clip(lo, 0, sk), 0).sum())


def _array(pos: Any) -> np.ndarray:
    return np.asarray(pos, dtype=np.int64)


def block_tasks(q_pos: Any, k_pos: Any, relation: Relation | Mask | bool = True
                ) -> tuple[Task, ...]:
    """Kernel calls that compute attention of queries at q_pos over keys at k_pos (sorted) under a
    relation or mask (True/False: plain causal/full). Rows that see no key get no task (the caller
    leaves them at lse = -inf)."""
    q, k = _array(q_pos), _array(k_pos)
    if isinstance(relation, Mask):
        if relation.relation is None:
            return _mask_tasks(q, k, relation)
        relation = relation.relation
    rel = as_relation(relation)
    if rel.full:
        return (Task(0, q.size, 0, k.size, "full"),)
    if not rel.plain:
        return range_tasks(*rel.ranges(q, k))
    return _causal_tasks(np.searchsorted(k, q, side="right").tolist())


def _causal_tasks(counts: list[int]) -> tuple[Task, ...]:
    """Row a sees the first counts[a] keys: diagonal runs (full + causal, or shifted) and flat ones."""
    sq = len(counts)
    tasks: list[Task] = []
    a0 = 0
    while a0 < sq:
        c0 = counts[a0]
        a1 = a0 + 1
        if a1 < sq and counts[a1] == c0 + 1:  # a diagonal run: row a sees keys [0, a + delta)
            while a1 < sq and counts[a1] == counts[a1 - 1] + 1:
                a1 += 1
            if c0 >= 1:
                if c0 > 1:
                    tasks.append(Task(a0, a1, 0, c0 - 1, "full"))
                tasks.append(Task(a0, a1, c0 - 1, c0 - 1 + (a1 - a0), "causal"))
            else:
                tasks.append(Task(a0, a1, 0, a1 - a0, "shifted"))
        else:  # a flat run: every row sees the same first c0 keys
            while a1 < sq and counts[a1] == c0:
                a1 += 1
            if c0 > 0:
                tasks.append(Task(a0, a1, 0, c0, "full"))
        a0 = a1
    return tuple(tasks)


def _mask_tasks(q: np.ndarray, k: np.ndarray, mask: Mask) -> tuple[Task, ...]:
    out: list[Task] = []
    for a0, lo, hi in mask.slice_ranges(q, k):
        out += [Task(t.q0 + a0, t.q1 + a0, t.k0, t.k1, t.mask, t.band)
                for t in range_tasks(lo, hi)]
    return tuple(out)


def range_tasks(lo: np.ndarray, hi: np.ndarray) -> tuple[Task, ...]:
    """Kernel calls for rows that see key indices [lo[a], hi[a]): runs of rows along which lo and
    hi each stay put or step by one (the same step all along a run); empty rows get nothing. The
    runs are found with numpy, so the loop below turns once per run, not per row."""
    lo, hi = _array(lo), _array(hi)
    n = lo.size
    if n == 0:
        return ()
    seen = hi > lo
    dl, dh = np.diff(lo), np.diff(hi)
    valid = seen[:-1] & seen[1:] & (dl >= 0) & (dl <= 1) & (dh >= 0) & (dh <= 1)
    # a step's code: 0..3 where it may extend a run, else unique (it never equals a neighbour)
    code = np.where(valid, 2 * dl + dh, 4 + np.arange(n - 1))
    change = np.flatnonzero(code[1:] != code[:-1])  # step i ends a constant stretch
    ends = np.full(n - 1, n - 2, dtype=np.int64)
    if change.size:
        stretch = np.searchsorted(change, np.arange(n - 1))  # which stretch step i is in
        bounds = np.append(change, n - 2)
        ends = bounds[stretch]
    lo_l, hi_l, seen_l = lo.tolist(), hi.tolist(), seen.tolist()
    tasks: list[Task] = []
    a0 = 0
    while a0 < n:
        if not seen_l[a0]:
            a0 += 1
            continue
        if a0 < n - 1 and valid[a0]:
            a1 = int(ends[a0]) + 2
            step = int(code[a0])
            tasks.extend(_run_tasks(a0, a1, lo_l[a0], hi_l[a0], step // 2, step % 2))
        else:
            a1 = a0 + 1
            tasks.extend(_run_tasks(a0, a1, lo_l[a0], hi_l[a0], 0, 0))
        a0 = a1
    return tuple(tasks)


def _run_tasks(a0: int, a1: int, lo: int, hi: int, dl: int, dh: int) -> list[Task]:
    """Row a0 + i sees keys [lo + dl*i, hi + dh*i), every row at least one."""
    rows = a1 - a0
    if dl == 0 and dh == 0:
        return [Task(a0, a1, lo, hi, "full")]
    if dl == 0:  # the upper edge steps: a full part and a causal triangle
        out = [Task(a0, a1, lo, hi - 1, "full")] if hi - 1 > lo else []
        return [*out, Task(a0, a1, hi - 1, hi - 1 + rows, "causal")]
    # the lower edge steps (a window): keys [lo, hi + dh*(rows-1)); row i sees j - i in [0, w)
    k1 = hi + dh * (rows - 1)
    width = hi - lo if dh else k1 - lo
    return [Task(a0, a1, lo, k1, "band", (0, width))]


@lru_cache(maxsize=4096)
def layout_tasks(layout: str, world: int, seq_len: int, q_rank: int, k_rank: int,
                 relation: Relation | Mask | bool) -> tuple[Task, ...]:
    """block_tasks for the shards of q_rank (queries) and k_rank (keys) in a layout, cached."""
    return block_tasks(rank_positions(layout, q_rank, world, seq_len, relation),
                       rank_positions(layout, k_rank, world, seq_len, relation), relation)


def rank_positions(layout: str, rank: int, world: int, seq_len: int,
                   relation: Relation | Mask | bool | None) -> tuple[int, ...]:
    """The positions `rank` holds under a call's relation or mask (its documents, and for the
    balanced layout the mask itself, decide the deal)."""
    rel = None if isinstance(relation, bool) else relation
    cu = getattr(rel, "cu", None)
    return layouts.positions(layout, rank, world, seq_len, cu, rel)


def sees(q_pos: Any, k_pos: Any, relation: Relation | Mask | bool = True) -> bool:
    """Whether any query at q_pos sees any key at k_pos (k_pos in any order): exactly when
    `block_tasks` plans at least one kernel call for the pair."""
    q, k = _array(q_pos), np.sort(_array(k_pos))
    if q.size == 0 or k.size == 0:
        return False
    if isinstance(relation, Mask):
        if relation.relation is None:
            return relation.sees(np.sort(q), k)
        relation = relation.relation
    rel = as_relation(relation)
    return rel.full or rel.pairs(q, k) > 0


@lru_cache(maxsize=256)
def layout_need(layout: str, world: int, seq_len: int, relation: Relation | Mask | bool,
                holders: tuple[tuple[int, ...], ...] | None = None) -> Need:
    """need[i][j]: whether the queries of holding i see any key of holding j, a holding being the
    shards of some ranks (`holders`; default: each rank its own shard). From the global relation,
    so every rank computes the same matrix; `route` skips the transfers it rules out."""
    holders = holders or tuple((r,) for r in range(world))
    pos = [np.sort(np.concatenate([np.asarray(rank_positions(layout, r, world, seq_len, relation),
                                              dtype=np.int64) for r in h])) for h in holders]
    return tuple(tuple(sees(pos[q], pos[k], relation) for k in range(len(pos)))
                 for q in range(len(pos)))


def rank_pairs(layout: str, world: int, seq_len: int, relation: Relation | Mask | bool
               ) -> list[int]:
    """Visible (query, key) pairs of each rank's queries over all keys: the attention work each
    rank of a ring-like algorithm does (max / mean over ranks: the load imbalance)."""
    rel = Relation(bool(relation)) if isinstance(relation, bool) else relation
    n = seq_len if rel.cu is None else rel.cu[-1]
    rows = rel.row_counts(seq_len) if isinstance(rel, Mask) else rel.row_counts(n)
    rows = np.concatenate([rows, np.zeros(max(seq_len - rows.size, 0), dtype=np.int64)])
    return [int(rows[[p for p in rank_positions(layout, r, world, seq_len, relation)]].sum())
            for r in range(world)]


def imbalance(loads: list[int]) -> float:
    """max / mean of per-rank loads (1.0: balanced)."""
    mean = sum(loads) / len(loads)
    return max(loads) / mean if mean else 1.0
