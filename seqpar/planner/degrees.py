"""The dynamic policy's group sizes solved exactly: a MILP over which group of the pool each
sequence runs on (scipy's HiGHS), against `rules.deal`'s greedy `degrees: cost`.

    sizes, bound, seconds = solve(lengths, pool=8, capacity=2048, cost=cost)

The model: x[i, g] = 1 when sequence i runs on group g (every group of every size the pool has,
`rules.pool.pool_groups`, of at least the smallest size that holds i), each sequence on one group;
m[g] >= the micro-batches group g needs for its tokens (at most |g| x capacity each); every rank's
device seconds (its sequences' `CostModel.device`) plus, on a CPU, its groups' micro-batches'
issue (`fixed_of`) at most T, on a GPU the issue at most T apart; minimise T. It leaves out what
the list scheduler adds (a group waits for all its ranks, packs are best-fit), so T is a lower
bound on any deal's makespan under the cost model, and its sizes, dealt by the list scheduler
(`rules.deal.deal(..., sizes=...)`), are a deal to compare with the greedy one.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import lil_matrix

from seqpar.rules.cost_model import CostModel
from seqpar.rules.pool import pool_groups, pool_sizes, smallest_size


def solve(lengths: Sequence[int], pool: int, capacity: int, cost: CostModel, *,
          any_size: bool = False, ranks_per_node: int | None = None,
          time_limit: float = 10.0) -> tuple[list[int] | None, float, float]:
    """(each sequence's group size, or None when HiGHS found no solution in `time_limit`; the
    best lower bound on T it proved; seconds it took)."""
    sizes = pool_sizes(pool, any_size)
    groups = [g for d in sizes for g in pool_groups(pool, d, ranks_per_node)]
    pairs: list[tuple[int, int]] = []  # (sequence, group) variables
    device: list[float] = []
    for i, n in enumerate(lengths):
        least = smallest_size(n, capacity, sizes) or pool
        for k, g in enumerate(groups):
            if len(g) >= least:
                pairs.append((i, k))
                device.append(cost.device(cost.attention_s(n, len(g)), n, len(g)))
    nx, ng = len(pairs), len(groups)
    nv = nx + ng + 1  # x[i, g], then m[g] (micro-batches on g), then T
    c = np.zeros(nv)
    c[-1] = 1.0
    one = lil_matrix((len(lengths), nv))
    room = lil_matrix((ng, nv))
    busy = lil_matrix((pool, nv))      # the device's seconds of each rank (and, on a CPU, the
    issue = lil_matrix((pool, nv))     # host's); the host's issue of each rank's micro-batches
    for v, ((i, k), s) in enumerate(zip(pairs, device, strict=True)):
        one[i, v] = 1.0
        room[k, v] = float(lengths[i])
        for r in groups[k]:
            busy[r, v] = s
    for k, g in enumerate(groups):
        room[k, nx + k] = -float(len(g) * capacity)
        for r in g:
            (issue if cost.host_overlaps else busy)[r, nx + k] = cost.fixed_of(len(g))
    busy[:, nv - 1] = -1.0
    issue[:, nv - 1] = -1.0
    rows = [LinearConstraint(one.tocsr(), 1.0, 1.0), LinearConstraint(room.tocsr(), -np.inf, 0.0),
            LinearConstraint(busy.tocsr(), -np.inf, 0.0)]
    if cost.host_overlaps:
        rows.append(LinearConstraint(issue.tocsr(), -np.inf, 0.0))
    integrality = np.r_[np.ones(nx + ng), 0.0]
    upper = np.r_[np.ones(nx), np.full(ng, float(len(lengths))), np.inf]
    start = time.perf_counter()
    res = milp(c, integrality=integrality, bounds=Bounds(np.zeros(nv), upper), constraints=rows,
               options={"time_limit": time_limit, "disp": False})
    took = time.perf_counter() - start
    bound = getattr(res, "mip_dual_bound", None)
    bound = float(bound if bound is not None else (res.fun if res.x is not None else 0.0))
    if res.x is None:
        return None, bound, took
    chosen = [0] * len(lengths)
    for v, (i, k) in enumerate(pairs):
        if res.x[v] > 0.5:
            chosen[i] = len(groups[k])
    return chosen, bound, took
