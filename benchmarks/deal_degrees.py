"""Issue 37's group sizes by cost: the greedy rule (`rules.deal`, `degrees: cost`) against the
smallest group that holds each sequence and against an exact MILP over the groups each sequence
may run on (`planner.degrees`, scipy's HiGHS), on steps of issue 30's workload on H100s.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/deal_degrees.py [--pools 4 8 16 32 64]
        [--tokens 65536] [--seeds 3] [--time-limit 10]

For each pool: the deal's makespan under `smallest` and `cost` (the deal's own cost model:
`planner.lengths.deal_cost` on h100-sxm, 4 GPUs a node, the 12-layer decoder), the MILP's proven
lower bound (T: every rank's load, each sequence alone a micro-batch, no waiting for a group's
ranks), the makespan of the MILP's sizes dealt by the same list scheduler, the gaps of each to
that bound, and the solver's seconds (where it found no solution within the limit: "-").
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from seqpar.planner import clusters
from seqpar.planner.degrees import solve
from seqpar.planner.lengths import deal_cost
from seqpar.rules.deal import deal
from seqpar.rules.lengths import draw_batches, parse
from seqpar.rules.model import load

MODEL = str(Path(__file__).with_name("plan_lengths_model.yaml"))
LENGTHS = "lognormal:mean=1024,sigma=1.5,min=128,max=8192"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pools", type=int, nargs="+", default=[4, 8, 16, 32, 64])
    ap.add_argument("--tokens", type=int, default=65536)
    ap.add_argument("--capacity", type=int, default=2048)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--any-size", action="store_true")
    a = ap.parse_args()
    cfg, c = load(MODEL), clusters.load("h100-sxm")
    dist = parse(LENGTHS)
    print(f"{LENGTHS}, {a.tokens:,} tokens a step, capacity {a.capacity}, h100-sxm, "
          f"{'any size' if a.any_size else 'powers of two'}; ms; gaps to the MILP's bound")
    print("pool seqs | smallest   cost   milp-sizes  bound | gap: smallest  cost  milp | "
          "solve s")
    for pool in a.pools:
        cost = deal_cost(cfg, c, "bfloat16", capacity=a.capacity, world=pool,
                         ranks_per_node=min(4, pool), any_size=a.any_size)
        rows = []
        for seed in range(a.seeds):
            lengths = [s.length for s in draw_batches(dist, a.tokens, 8192, seed, 1)[0]]
            kw = {"ranks_per_node": min(4, pool), "any_size": a.any_size}
            small = deal(lengths, pool, a.capacity, "dynamic", cost, **kw).makespan
            wide = deal(lengths, pool, a.capacity, "dynamic", cost, degrees="cost", **kw).makespan
            sizes, bound, took = solve(lengths, pool, a.capacity, cost, any_size=a.any_size,
                                       ranks_per_node=min(4, pool), time_limit=a.time_limit)
            exact = (deal(lengths, pool, a.capacity, "dynamic", cost, sizes=sizes, **kw).makespan
                     if sizes else float("nan"))
            rows.append((len(lengths), small, wide, exact, bound, took, sizes is not None))
            print(f"{pool:4} {len(lengths):4} | {1e3 * small:8.1f} {1e3 * wide:7.1f} "
                  f"{1e3 * exact:10.1f} {1e3 * bound:7.1f} | {small / bound:12.3f} "
                  f"{wide / bound:5.3f} {exact / bound:5.3f} | "
                  f"{took:6.2f}{'' if sizes else ' (no solution)'}")
        gains = [r[1] / r[2] for r in rows]
        print(f"     cost over smallest: {statistics.mean(gains):.3f}x mean, {max(gains):.3f}x "
              f"at most")


if __name__ == "__main__":
    main()
