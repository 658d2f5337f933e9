"""Platform overhead on Ray: start-up, and the cost per trial with and without gang re-use.

    .venv/bin/python benchmarks/platform_overhead.py [--trials 10] [--world 4] [--json]

Numbers: Ray start-up (an embedded local Ray with dashboard: `TrialRunner()`); per trial the wall
time of `runner.run`, the compute inside it (the slowest rank's warm-up + timed iterations) and the
overhead = wall - compute (gang start or reuse, rendezvous, process group, teardown, result
transfer). Re-use keeps one experiment id, so every trial after the first runs on the same gang;
without re-use each trial gets a new experiment id and therefore a fresh gang.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from seqpar.case import Case, Trial
from seqpar.workers.trial import TrialRunner

os.environ.setdefault("OMP_NUM_THREADS", "1")


def one_trial(runner, case, experiment_id: str) -> dict[str, float]:
    start = time.perf_counter()
    result = runner.run(Trial(case, experiment_id, nodes=2))
    wall = time.perf_counter() - start
    if not result.ok:
        raise SystemExit(f"trial failed: {result.cause}")
    compute = max(m.extra["measure_s"] for m in result.per_rank)
    return {"wall_s": wall, "compute_s": compute, "overhead_s": wall - compute,
            "setup_s": result.setup_s, "reused": float(result.gang_reused)}


def summary(rows: list[dict[str, float]]) -> dict[str, float]:
    later = rows[1:] or rows
    return {"first_wall_s": rows[0]["wall_s"],
            "later_wall_s_median": statistics.median(r["wall_s"] for r in later),
            "later_wall_s_max": max(r["wall_s"] for r in later),
            "later_overhead_s_median": statistics.median(r["overhead_s"] for r in later),
            "later_compute_s_median": statistics.median(r["compute_s"] for r in later)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    case = Case("ring", world=args.world, batch=1, seq_len=16 * args.world, heads=2, kv_heads=2,
                head_dim=8, dtype="float32", warmup=1, iters=3)
    start = time.perf_counter()
    runner = TrialRunner(device="cpu")
    startup_s = time.perf_counter() - start
    try:
        reuse = [one_trial(runner, case, "bench-reuse") for _ in range(args.trials)]
        fresh = [one_trial(runner, case, f"bench-fresh-{i}") for i in range(args.trials)]
    finally:
        start = time.perf_counter()
        runner.close()
        shutdown_s = time.perf_counter() - start
    report = {"ray_startup_s": startup_s, "ray_shutdown_s": shutdown_s, "world": args.world,
              "trials": args.trials, "with_reuse": summary(reuse), "without_reuse": summary(fresh),
              "rows": {"with_reuse": reuse, "without_reuse": fresh}}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"Ray start-up (embedded, dashboard): {startup_s:.2f} s; shutdown {shutdown_s:.2f} s")
    print(f"{args.trials} trials of ring P={args.world} (2x{args.world // 2} virtual), "
          f"1 warm-up + 3 timed iterations each")
    for name in ("with_reuse", "without_reuse"):
        s = report[name]
        print(f"  {name:14s} first {s['first_wall_s']:.2f} s | later: wall median "
              f"{s['later_wall_s_median']:.3f} s (max {s['later_wall_s_max']:.3f}), overhead "
              f"median {s['later_overhead_s_median']:.3f} s, compute "
              f"{s['later_compute_s_median']:.3f} s")


if __name__ == "__main__":
    main()
