"""Which attention configurations can win (`search.search`): what a step depends on from one
(`metrics`, lower is better) and the configurations no other beats or equals on all of it
(`pareto`); the rest are dominated, no policy making them win.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from seqpar.planner import memory
from seqpar.planner.api import Prediction
from seqpar.planner.policy import seq_attn_runs
from seqpar.planner.step import Setup


def metrics(setup: Setup, sp: int, p: Prediction, prefixes: Sequence[float]) -> tuple:
    """Everything a step depends on from its attention configuration (lower is better): each
    layer kind's attention; with `prefixes` (the seq-attn fractions searched) the forward each
    re-runs in each kind, where it runs."""
    held = memory.attention_held(p.algorithm, setup.shape, sp, p.options)
    kinds = setup.kinds(sp, p)
    again: list[float] = []
    for f in prefixes:
        runs = seq_attn_runs(f, p.algorithm, p.layout, sp, setup.seq_len, setup.causal)
        for kind in kinds:
            if runs:
                q = setup.prefix(sp, p, f, kind)
                again += [q.forward_ms, *q.forward_link_ms.values()]
            else:
                again += [float("inf")] * 3
    others = [x for kind, q in kinds.items() if kind != "full"
              for x in (q.attention_ms, q.forward_ms, q.compute_ms, *q.link_ms.values(),
                        *q.forward_link_ms.values())]
    return (p.attention_ms, p.forward_ms, p.compute_ms, *p.link_ms.values(),
            *p.forward_link_ms.values(), p.peak_mem_bytes, held.saved,
            held.saved - held.recomputable, int(held.relayout), memory.AXES.get(p.algorithm, 0),
            *again, *others)


def pareto(rows: list[tuple]) -> tuple[list[int], dict[int, list[int]], dict[int, int]]:
    """Indices of the rows no other row beats or equals on every metric (the first of equal rows
    kept), for each kept row the indices equal to it, and for each row another beats the first
    kept row that does (a row beaten is beaten by some kept row: dominance is transitive).
    Metrics compare to 9 significant digits."""
    if not rows:
        return [], {}, {}
    nine: dict[float, float] = {}  # a value to 9 significant digits (a plan's rows share most)
    x = [tuple(nine[v] if v in nine else nine.setdefault(v, float(f"{v:.9g}")) for v in r)
         for r in rows]
    alike: dict[tuple, int] = {}  # each distinct row compared once (alike configurations abound)
    which = np.array([alike.setdefault(r, len(alike)) for r in x])
    u = np.array(list(alike), dtype=float).reshape(len(alike), -1)
    n = len(rows)
    le = np.ones((len(u), len(u)), dtype=bool)  # [i, j]: row j is no worse than row i anywhere
    for col in u.T:
        le &= col[None, :] <= col[:, None]
    le = le[which][:, which]
    eq = le & le.T  # no worse either way: equal (NaN: neither)
    better = le & ~eq
    beaten = better.any(axis=1)
    first = eq.argmax(axis=1)
    keep = [i for i in range(n) if not beaten[i] and first[i] == i]
    kept = np.zeros(n, dtype=bool)
    kept[keep] = True
    same = {i: [j for j in np.flatnonzero(eq[i]) if j != i] for i in keep}
    return keep, same, {int(i): int(np.argmax(better[i] & kept)) for i in np.flatnonzero(beaten)}
