"""Issue 36's regime: steps of a few thousand tokens a GPU, where the host's issuing (dispatch,
launches, collective issue) and not the FLOPs sets a step's time. Issue 30's decoder on 4-64 H100s
(4 a node) with steps of 8K to 1M tokens: each SP policy's best predicted step, its host part (what
the device does not hide) and whether the host sets the pace, and the dynamic/static speedup, with
the host model and without it (`dispatch_us` 0: every operation free to issue, the planner before
issue 36).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/plan_host.py [--worlds 4 16 64]
        [--tokens 8192 65536 1048576] [--degrees cost] [--auto]

Workload: lengths lognormal mean 1024, sigma 1.5, 128-8192 tokens; capacity 2,048 tokens a rank;
the 12-layer decoder of benchmarks/plan_lengths_model.yaml; h100-sxm's rates (flash2). `--degrees
cost` and `--auto` add the dynamic policy with group sizes by cost and with the algorithm chosen
per group size (issue 37) beside the best dynamic step of today's rule.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from seqpar.planner import clusters
from seqpar.planner.lengths import Workload
from seqpar.planner.lengths_plan import LengthPlan
from seqpar.planner.lengths_step import LengthStep
from seqpar.planner.policy import Filters

MODEL = str(Path(__file__).with_name("plan_lengths_model.yaml"))
LENGTHS = "lognormal:mean=1024,sigma=1.5,min=128,max=8192"


def best(steps: list[LengthStep], policy: str, auto: bool = False) -> LengthStep:
    """The fastest fitting step of `policy` (free deals; one algorithm for every size unless
    `auto`)."""
    return next(s for s in steps if s.fits and s.sp_policy == policy
                and not s.split.equal_counts and (s.algorithm == "auto") == auto)


def show(tag: str, s: LengthStep) -> str:
    sizes = f"sp={s.sp}" if s.sp_policy == "static" else "/".join(map(str, s.degrees))
    algo = s.algorithm if s.algorithm != "auto" else "auto(" + ",".join(
        f"{d}:{n}" for d, (n, _) in sorted(s.by_size.items())) + ")"
    opts = ",".join(f"{k}={v}" for k, v in s.options.items() if v is not None)
    return (f"{tag:16} {s.step_ms:9.2f} ms  host {s.parts.get('host', 0.0):7.2f} ms"
            f"{' host-bound' if s.host_bound else '           '}  {algo:28} {sizes:12} "
            f"{s.policy.label()} {opts}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worlds", type=int, nargs="+", default=[4, 16, 64])
    ap.add_argument("--tokens", type=int, nargs="+", default=[8192, 32768, 131072, 1048576])
    ap.add_argument("--batches", type=int, default=2)
    ap.add_argument("--degrees", choices=("smallest", "cost"), default="smallest")
    ap.add_argument("--auto", action="store_true", help="the algorithm chosen per group size")
    ap.add_argument("--capacity", type=int, default=2048, help="tokens a rank holds")
    ap.add_argument("--dispatch-us", type=float, default=None,
                    help="the host's issue of an operation (default: the preset's)")
    ap.add_argument("--model", default=MODEL, help="another decoder (a preset or a file)")
    a = ap.parse_args()
    h100 = clusters.load("h100-sxm")
    if a.dispatch_us is not None:
        h100 = h100.model_copy(update={"dispatch_us": a.dispatch_us})
    free = h100.model_copy(update={"dispatch_us": 0.0})
    print(f"{LENGTHS}, capacity {a.capacity} a rank, {a.model}, h100-sxm (flash2, dispatch "
          f"{h100.dispatch_us:g} us an operation), 4 GPUs a node")
    for p in a.worlds:
        for tokens in a.tokens:
            if tokens < p * 128:
                continue
            t0 = time.perf_counter()
            work = Workload.of(LENGTHS, tokens, 8192, a.capacity, batches=a.batches)
            ratios = []
            print(f"\nP = {p}, {tokens:,} tokens a step ({tokens // p:,} a GPU)")
            for name, cluster in (("host model", h100), ("no host", free)):
                plan = LengthPlan.make(cluster, a.model, work, p, max(1, p // 4))
                steps = plan.search()
                st, dy = best(steps, "static"), best(steps, "dynamic")
                ratios.append(st.step_ms / dy.step_ms)
                print(f"  {name}:")
                print("    " + show("static", st))
                print("    " + show("dynamic", dy))
                if name == "host model" and (a.degrees == "cost" or a.auto):
                    more = plan.search(Filters(algorithm="auto") if a.auto else Filters(),
                                       policies=("dynamic",), degrees=a.degrees)
                    s = best(more, "dynamic", a.auto)
                    tag = ("dynamic " + ("auto " if a.auto else "") + a.degrees).strip()
                    print("    " + show(tag, s) + f"  ({dy.step_ms / s.step_ms:.3f}x dynamic)")
            print(f"  dynamic / static speedup: {ratios[0]:.3f}x with the host model, "
                  f"{ratios[1]:.3f}x without ({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
