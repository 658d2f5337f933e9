"""How close the deal (`rules.deal`, what the runner executes and the planner times) comes to its
lower bound: its predicted makespan over max(the rank-seconds any packing needs / P, the longest
single micro-batch), on lognormal draws at P = 8 to 1,024, and how long dealing a step takes.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/deal_gap.py [--micro 4] [--seeds 4]

Workload: issue 30's (lengths lognormal mean 1024, sigma 1.5, 128-8192 tokens; capacity 2,048
tokens a rank; `--micro` x P x capacity tokens a step), the cost model the planner deals by
(`perf.lengths.deal_cost`) for the 12-layer model of benchmarks/plan_lengths_model.yaml on H100s,
4 a node. Policies: dynamic (free schedule), dynamic with equal counts (its rounds: what FSDP
runs), static at SP 4 (the smallest degree that holds 8,192 tokens) with best-fit and cost-balanced
packs. Gap = makespan / lower bound, the mean and the worst over the seeds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from seqpar.planner import clusters
from seqpar.planner.lengths import deal_cost
from seqpar.planner.rates import with_kernel
from seqpar.rules.deal import deal
from seqpar.rules.lengths import draw_batches, parse
from seqpar.rules.model import load

MODEL = str(Path(__file__).with_name("plan_lengths_model.yaml"))
LENGTHS = "lognormal:mean=1024,sigma=1.5,min=128,max=8192"
CAPACITY, PER_NODE = 2048, 4
POLICIES = {"dynamic": ("dynamic", {}), "dynamic, equal counts (rounds)":
            ("dynamic", {"equal_counts": True}),
            "static sp=4 best-fit": ("static", {"degree": 4}),
            "static sp=4 cost-balanced": ("static", {"degree": 4, "packing": "cost-balanced"})}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--micro", type=int, default=4, help="tokens a step: micro x P x capacity")
    ap.add_argument("--seeds", type=int, default=4)
    a = ap.parse_args()
    cfg = load(MODEL)
    cluster = with_kernel(clusters.load("h100-sxm"), "flash2", cfg.head_dim, "bfloat16")[0]
    dist = parse(LENGTHS)
    print(f"load average before: {os.getloadavg()[0]:.2f} (2 cores)")
    print(f"{LENGTHS}, capacity {CAPACITY}, {a.micro} x P x capacity tokens a step, "
          f"{a.seeds} seeds; gap = makespan / lower bound: mean (worst); deal seconds: mean")
    print(f"{'P':>5} {'sequences':>9}  " + "  ".join(f"{k:>30}" for k in POLICIES))
    for p in (8, 16, 32, 64, 128, 256, 512, 1024):
        cost = deal_cost(cfg, cluster, "bfloat16", capacity=CAPACITY, world=p,
                         ranks_per_node=PER_NODE)
        tokens = a.micro * p * CAPACITY
        cells, count = [], 0
        for policy, extra in POLICIES.values():
            gaps, took = [], []
            for seed in range(a.seeds):
                lengths = [s.length for s in draw_batches(dist, tokens, 8192, seed, 1)[0]]
                count = len(lengths)
                t0 = time.perf_counter()
                d = deal(lengths, p, CAPACITY, policy, cost, ranks_per_node=PER_NODE, **extra)
                took.append(time.perf_counter() - t0)
                span = d.round_makespan if extra.get("equal_counts") else d.makespan
                gaps.append(span / d.lower_bound)
            cells.append(f"{statistics.mean(gaps):.4f} ({max(gaps):.4f}) {statistics.mean(took):.3f}s")
        print(f"{p:>5} {count:>9}  " + "  ".join(f"{c:>30}" for c in cells))
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
