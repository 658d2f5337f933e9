"""A long sweep of tiny trials: what the platform costs around them as the sweep grows.

    .venv/bin/python benchmarks/sweep_scale.py [--trials 1000] [--store DIR] [--trace] [--json]

The sweep: 4 algorithms (ring, ulysses, allgather, usp) x trials/4 sequence lengths (multiples of
16 from 64), world 2, H=2, D=8, 1 warm-up + 2 timed iterations, into the MLflow store DIR/mlflow.db.
Each trial ends with a sample of the driver's resident memory and every rank actor's, the trial's
wall time on the platform (the TrialRunner's setup + run, i.e. without MLflow) and the time its
MLflow logging took. Printed: each quarter's medians (driver and rank RSS, platform and logging
time per trial), the closing report's time and the driver's RSS after it, and the sweep id (for
`seqpar compare`, `seqpar report`, `seqpar sweep --resume` on the same store). `--trace` takes a
tracemalloc snapshot after the first and the last trial and prints the 12 biggest growths by line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import tracemalloc
from pathlib import Path

import psutil

from seqpar.platform.heap import bound_heap
from seqpar.platform.tracking import Tracker
from seqpar.sweeps import runner as sweep_runner
from seqpar.sweeps import spec
from seqpar.workers.trial import TrialRunner

os.environ.setdefault("OMP_NUM_THREADS", "1")
ALGORITHMS = ["ring", "ulysses", "allgather", "usp"]
MIB = 2**20


def sweep_file(trials: int) -> dict:
    lengths = [64 + 16 * i for i in range(max(1, trials // len(ALGORITHMS)))]
    return {"name": f"scale-{trials}",
            "base": {"model": {"heads": 2, "kv_heads": 2, "head_dim": 8},
                     "plan": {"world": 2, "layout": "zigzag"},
                     "workload": {"iters": 2, "warmup": 1, "causal": True},
                     "env": {"device": "cpu"}},
            "grid": {"plan.algorithm": ALGORITHMS, "workload.seq_len": lengths}}


def rank_rss(trial_runner: TrialRunner) -> list[float]:
    """Resident MiB of every rank actor of the runner's idle gang (same machine: by pid)."""
    import ray

    gang = trial_runner.pool._idle  # the gang the sweep re-uses, idle between trials
    if gang is None:
        return []
    pids = ray.get([a.heartbeat.remote() for a in gang.actors], timeout=10)
    return [psutil.Process(b["pid"]).memory_info().rss / MIB for b in pids]


def quarters(values: list[float]) -> list[float]:
    n = len(values)
    parts = [values[i * n // 4:(i + 1) * n // 4] for i in range(4)]
    return [round(statistics.median(p), 2) if p else float("nan") for p in parts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--store", default="/tmp/seqpar-sweep-scale")
    parser.add_argument("--trace", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    Path(args.store).mkdir(parents=True, exist_ok=True)
    tracker = Tracker(f"sqlite:///{Path(args.store).resolve() / 'mlflow.db'}")
    plan = spec.parse(sweep_file(args.trials))
    me = psutil.Process()
    rows: list[dict[str, float]] = []
    log_s: list[float] = []
    original = tracker.log_trial

    def timed_log(*a, **k):
        t0 = time.perf_counter()
        try:
            return original(*a, **k)
        finally:
            log_s.append(time.perf_counter() - t0)

    tracker.log_trial = timed_log
    snapshots: list[tracemalloc.Snapshot] = []
    if args.trace:
        tracemalloc.start(8)

    bound_heap()  # as `seqpar sweep` does, before Ray starts
    with TrialRunner(device="cpu") as trials:
        def sample(outcome) -> None:
            r = outcome.result
            ranks = rank_rss(trials)
            rows.append({"driver_mib": me.memory_info().rss / MIB,
                         "rank_mib": max(ranks) if ranks else float("nan"),
                         "platform_s": r.setup_s + r.run_s, "log_s": log_s[-1]})
            if args.trace and len(rows) in (1, len(plan.trials)):
                snapshots.append(tracemalloc.take_snapshot())

        t0 = time.perf_counter()
        outcome = sweep_runner.run_sweep(plan, tracker=tracker, runner=trials, progress=False,
                                         on_trial_end=sample)
        total_s = time.perf_counter() - t0
        after_report = me.memory_info().rss / MIB
        ranks_end = rank_rss(trials)
    result = {
        "sweep_id": outcome.sweep_id, "store": tracker.uri, "trials": len(rows),
        "wall_s": round(total_s, 1), "s_per_trial": round(total_s / max(1, len(rows)), 3),
        "driver_mib_by_quarter": quarters([r["driver_mib"] for r in rows]),
        "driver_mib_after_report": round(after_report, 1),
        "rank_mib_by_quarter": quarters([r["rank_mib"] for r in rows]),
        "rank_mib_end": [round(v, 1) for v in ranks_end],
        "platform_s_by_quarter": quarters([r["platform_s"] for r in rows]),
        "mlflow_log_s_by_quarter": quarters([r["log_s"] for r in rows]),
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            print(f"{key:28s} {value}")
    if len(snapshots) == 2:
        traced = [sum(s.size for s in snap.statistics("filename")) / MIB for snap in snapshots]
        print(f"tracemalloc: traced {traced[0]:.1f} -> {traced[1]:.1f} MiB; biggest growth "
              "between the first and the last trial")
        for stat in snapshots[1].compare_to(snapshots[0], "traceback")[:12]:
            ours = [f for f in stat.traceback if "/seqpar/" in f.filename] or list(stat.traceback)
            where = "; ".join(f"{Path(f.filename).name}:{f.lineno}" for f in ours[:3])
            print(f"  {stat.size_diff / 1024:9.1f} KiB  {stat.count_diff:+7d} blocks  {where}")


if __name__ == "__main__":
    main()
