"""Issue 30's planner numbers: a long-tailed length distribution on 4 to 64 H100s (4 a node), each
SP policy's best predicted step, the dynamic/static speedup and what the difference is made of.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/plan_lengths.py [--tokens 1048576] [--batches 4]
        [--model llama3.1-8b] [--worlds 4 8 12 16 24 32 64] [--any-size]

Workload: lengths lognormal mean 1024, sigma 1.5, 128-8192 tokens; capacity 2,048 tokens a rank (a
static SP group needs 4 ranks for the longest sequence); `--tokens` a step (default 1M, the same at
every P); each policy's best, then the dynamic policy's best under each states choice (replicated,
zero1: AdamW's moments sharded over the pool, dp_sp: FSDP with equal counts); the 12-layer decoder
of benchmarks/plan_lengths_model.yaml (hidden 2048, 16 heads and kv heads, ffn 8192, vocab 131072);
h100-sxm's rates (flash2), `--nodes` = P / 4. Each policy's row is its best configuration
(algorithm, SP degree, states and checkpointing) by TGS; the parts are the mean rank's, in ms: at
attention kernels, ac its exposed communication, oc other compute, rc recompute, id idle (waiting
on the slowest rank), cm FSDP past the rounds, the gradient all-reduce and zero1's broadcast, op
optimizer. The same as `seqpar plan --scope cluster --lengths ...` (docs/planner.md).

`--any-size` compares the dynamic policy's group sizes instead (`seqpar plan --group-sizes`): the
best free deal (replicated or zero1 states) with power-of-two groups (Megatron-LM) against groups
of any size (ByteScale), each with its idle time, imbalance and the deal's gap, and the
power-of-two winner's algorithm under any size where it runs there.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from seqpar.planner import clusters
from seqpar.planner.lengths import Workload
from seqpar.planner.lengths_plan import LengthPlan
from seqpar.planner.lengths_step import PARTS, LengthStep

MODEL = str(Path(__file__).with_name("plan_lengths_model.yaml"))
LENGTHS = "lognormal:mean=1024,sigma=1.5,min=128,max=8192"
SHORT = dict(zip(PARTS, ("at", "ac", "oc", "rc", "id", "cm", "op", "ho"), strict=True))


def kind(s: LengthStep) -> str:
    if s.sp_policy == "static":
        return f"static {s.split.packing}"
    return "dynamic" + (" equal counts" if s.split.equal_counts else "") + (
        " any size" if s.split.any_size else "")


def row(s: LengthStep) -> str:
    where = " ".join(f"{SHORT[k]} {v:.1f}" for k, v in s.parts.items())
    sp = f"sp={s.sp}" if s.sp_policy == "static" else "sizes " + "/".join(map(str, s.degrees))
    return (f"{kind(s):26} {s.step_ms:9.1f} ms {s.tgs:9,.0f} TGS {s.peak_mem_bytes / 1e9:5.1f} GB "
            f" {s.algorithm:9} {sp:13} {s.policy.label():18} imb {s.imbalance:.3f} busy "
            f"{s.busy_imbalance:.3f} | {where}")


def any_size(p: int, plan: LengthPlan) -> None:
    """P = p: the best free dynamic step under each group-sizes choice, and why."""
    best: dict[str, LengthStep] = {}
    steps: dict[str, list[LengthStep]] = {}
    for sizes in ("power-of-two", "any"):
        steps[sizes] = [s for s in plan.search(policies=("dynamic",), group_sizes=sizes)
                        if s.fits and not s.split.equal_counts]
        best[sizes] = steps[sizes][0]
        s = best[sizes]
        print(f"  {sizes:13} {s.step_ms:9.1f} ms {s.algorithm:9} {s.policy.label():16} sizes "
              f"{'/'.join(map(str, s.degrees)):12} idle {s.parts['idle']:6.1f} ms imb "
              f"{s.imbalance:.3f} busy {s.busy_imbalance:.3f} gap {s.gap:.4f} | at "
              f"{s.parts['attention']:.1f} ac {s.parts['attention_comm']:.1f}")
    two, anyone = best["power-of-two"], best["any"]
    print(f"  any / power-of-two: {anyone.step_ms / two.step_ms:.3f}x the step")
    for win, other in (("power-of-two", "any"), ("any", "power-of-two")):
        w = best[win]
        same = next((s for s in steps[other] if (s.algorithm, s.options, s.layout, s.policy)
                     == (w.algorithm, w.options, w.layout, w.policy)), None)
        print(f"    {win}'s {w.algorithm} under {other}: " + (
            f"{same.step_ms:.1f} ms ({same.step_ms / w.step_ms:.3f}x), idle "
            f"{same.parts['idle']:.1f} ms, gap {same.gap:.4f}, sizes "
            f"{'/'.join(map(str, same.degrees))}" if same else "cannot run at every size"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=2 ** 20)
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--model", default=MODEL, help="another decoder (a preset or a file)")
    ap.add_argument("--worlds", type=int, nargs="+", default=[4, 8, 16, 32, 64])
    ap.add_argument("--capacity", type=int, default=2048, help="tokens a rank holds")
    ap.add_argument("--any-size", action="store_true",
                    help="the dynamic policy's power-of-two groups against any size")
    a = ap.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f} (2 cores)")
    print(f"{LENGTHS}, capacity {a.capacity} a rank, {a.tokens:,} tokens a step, {a.batches} batches, "
          f"{a.model}, h100-sxm (flash2), 4 GPUs a node")
    for p in a.worlds:
        t0 = time.perf_counter()
        work = Workload.of(LENGTHS, a.tokens, 8192, a.capacity, batches=a.batches)
        plan = LengthPlan.make(clusters.load("h100-sxm"), a.model, work, p, max(1, p // 4))
        if a.any_size:
            print(f"\nP = {p}, dynamic, the free deal (replicated or zero1 states)")
            any_size(p, plan)
            print(f"  ({time.perf_counter() - t0:.2f} s to plan)")
            continue
        best: dict[str, LengthStep] = {}
        states: dict[str, LengthStep] = {}  # the best dynamic step of each states choice
        for s in plan.search():
            if s.fits:
                best.setdefault(kind(s), s)
                if s.sp_policy == "dynamic":
                    states.setdefault(s.policy.states, s)
        print(f"\nP = {p} ({time.perf_counter() - t0:.2f} s to plan)")
        for s in best.values():
            print("  " + row(s))
        print("  dynamic, the best of each states choice (dp_sp: FSDP, equal counts):")
        for s in sorted(states.values(), key=lambda s: s.step_ms):
            print("    " + row(s))
        dyn = best["dynamic"]
        static = min((s for k, s in best.items() if k.startswith("static")),
                     key=lambda s: s.step_ms)
        diff = ", ".join(f"{SHORT[k]} {static.parts[k] - dyn.parts[k]:+.1f}" for k in PARTS
                         if abs(static.parts[k] - dyn.parts[k]) >= 0.05)
        print(f"  dynamic / best static ({kind(static)} sp={static.sp}): speedup "
              f"{static.step_ms / dyn.step_ms:.3f}x; static - dynamic: {diff} ms")
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
