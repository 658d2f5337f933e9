"""`algorithm: auto` on a dynamic deal: at each group size the algorithm and options predicted
fastest for a full micro-batch there (`choose`), for the plan of lengths and, on the driver, for a
run (`auto_algorithms`), with the same rates."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from seqpar.errors import ConfigError, require
from seqpar.planner import host
from seqpar.planner.clusters import Cluster
from seqpar.planner.lengths import Workload
from seqpar.planner.lengths_costs import LengthCosts
from seqpar.planner.policy import Filters
from seqpar.planner.rates import DEFAULT_KERNEL
from seqpar.planner.search import attention_space
from seqpar.rules import algorithms
from seqpar.rules import lengths as length_rules
from seqpar.rules.model import ModelConfig
from seqpar.rules.pool import AUTO, LOCAL


def choose(plan: LengthCosts, sizes: list[int], layout: str, filters: Filters
           ) -> dict[int, tuple[str, dict[str, Any]]]:
    """At each group size the algorithm and options predicted fastest for a full micro-batch
    there (its attention, exposed communication and host issue at that size: `plan.rates`,
    `plan.issue`), among those that run at that size; `local` on one rank."""
    out: dict[int, tuple[str, dict[str, Any]]] = {}
    for d in sizes:
        if d == 1:
            out[d] = (LOCAL, {})
            continue
        best, chosen = float("inf"), None
        for name, options in attention_space(d, replace(filters, algorithm=None)):
            try:
                algorithms.check(name, plan.shape(d), d, layout, True, **options)
            except ConfigError:
                continue
            r = plan.rates(d, name, options, layout)
            seconds = host.stretch(plan.cluster, r.prediction.attention_ms / 1e3
                                   * plan.cfg.layers, plan.issue(d, name, options, layout,
                                                                 "none")[0])
            if seconds < best:
                best, chosen = seconds, (name, dict(options))
        require(chosen is not None, "algorithm", AUTO,
                f"no algorithm runs on a group of {d} ranks with this model "
                f"({plan.cfg.heads} heads, {plan.cfg.kv_heads} KV heads) in {layout}")
        out[d] = chosen
    return out


def auto_algorithms(cluster: Cluster, cfg: ModelConfig, dtype: str, capacity: int, world: int,
                    nodes: int, sizes: list[int], layout: str, window: int | None = None
                    ) -> dict[int, tuple[str, dict[str, Any]]]:
    """`algorithm: auto` for a run: what each group size of its deals runs (`choose`), chosen on
    the driver with the same rates the plan uses."""
    work = Workload(length_rules.parse(f"fixed:{capacity}"), world * capacity, capacity,
                    capacity, window=window)
    plan = LengthCosts.make(cluster, cfg, work, world, max(1, nodes), dtype=dtype,
                            kernel=cluster.kernel or DEFAULT_KERNEL)
    return choose(plan, sorted(sizes), layout, Filters(layout=layout))
