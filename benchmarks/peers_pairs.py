"""Each of seqpar's algorithms beside the peer doing the same thing (the `peers` study's pairs, the same
CPU kernel on both sides), through seqpar's own harness (`build` and `timed_pass` of
workers.measure, on local gloo ranks): the ratio seqpar / peer of median wall step times (slowest
rank per pass) with a 95% bootstrap interval, forward and backward apart, and of the CPU time the
ranks' processes spent per pass (robust on a shared host, where the wall clock mostly measures the
neighbours). Rounds alternate the two sides, so a busy neighbour slows both alike; a ratio whose
interval holds 1 is no measurable difference.

    .venv/bin/python benchmarks/peers_pairs.py --world 2 --seq-len 1024 2048 --rounds 6
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

import torch

from seqpar.case import Case
from seqpar.platform.localgang import LocalGang
from seqpar.workers.measure.attention import build, local_inputs
from seqpar.workers.measure.check import mesh_key
from seqpar.workers.measure.timing import timed_pass

PAIRS = [("ulysses", "peer:yunchang-ulysses", "contiguous", ()),
         ("ring", "peer:torch-cp-ring", "zigzag", (("rotate", "allgather"),)),
         ("ring", "peer:torch-cp-ring", "zigzag", (("rotate", "alltoall"),))]


def passes(env, case: Case) -> list[tuple[float, float, float]]:
    """On one rank: (forward s, backward s, process CPU s) of each timed pass after the warm-up."""
    torch.set_num_threads(1)
    group = env.group(case.world)
    attn = build(case, group, env.mesh)
    q, k, v, dout = local_inputs(case, env.rank, torch.device("cpu"))
    out = []
    for i in range(case.warmup + case.iters):
        cpu = time.process_time()
        fwd, bwd, _ = timed_pass(attn, (q, k, v), dout, {}, group, torch.device("cpu"))
        if i >= case.warmup:
            out.append((fwd, bwd, time.process_time() - cpu))
    return out


def step_times(gang: LocalGang, case: Case) -> dict[str, list[float]]:
    """Per timed pass: the slowest rank's step, forward and backward, and the ranks' mean CPU (ms)."""
    ranks = gang.run(passes, case, size=case.world, mesh=mesh_key(case))
    per_pass = list(zip(*ranks, strict=True))
    return {"step_ms": [1e3 * max(f + b for f, b, _ in p) for p in per_pass],
            "fwd_ms": [1e3 * max(f for f, _, _ in p) for p in per_pass],
            "bwd_ms": [1e3 * max(b for _, b, _ in p) for p in per_pass],
            "cpu_ms": [1e3 * statistics.mean(c for _, _, c in p) for p in per_pass]}


def ratio_interval(a: list[float], b: list[float], draws: int = 2000,
                   seed: int = 0) -> tuple[float, float, float]:
    """median(a) / median(b) and its 95% percentile-bootstrap interval (each side resampled)."""
    rng = random.Random(seed)
    ratios = sorted(statistics.median(rng.choices(a, k=len(a)))
                    / statistics.median(rng.choices(b, k=len(b))) for _ in range(draws))
    return (statistics.median(a) / statistics.median(b), ratios[int(0.025 * draws)],
            ratios[int(0.975 * draws) - 1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--seq-len", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--rounds", type=int, default=6, help="alternations of the two sides")
    parser.add_argument("--iters", type=int, default=5, help="timed iterations per round")
    args = parser.parse_args()
    print(f"P={args.world} H={args.heads} D={args.head_dim} B=1 {args.dtype} causal, fwd+bwd, one "
          f"thread per rank; {args.rounds} rounds x {args.iters} passes per side; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    with LocalGang(args.world, sizes=(args.world,), device="cpu") as gang:
        for n in args.seq_len:
            for ours, peer, layout, options in PAIRS:
                cases = [Case(name, args.world, layout, True, batch=1, seq_len=n,
                              heads=args.heads, kv_heads=args.heads, head_dim=args.head_dim,
                              dtype=args.dtype, options=options if name == peer else (),
                              warmup=2, iters=args.iters) for name in (ours, peer)]
                got: list[dict[str, list[float]]] = [{}, {}]
                for _ in range(args.rounds):
                    for side, case in enumerate(cases):
                        for name, values in step_times(gang, case).items():
                            got[side].setdefault(name, []).extend(values)
                line = []
                for name in ("step_ms", "fwd_ms", "bwd_ms", "cpu_ms"):
                    r, lo, hi = ratio_interval(got[0][name], got[1][name])
                    verdict = "no measurable difference" if lo <= 1 <= hi else (
                        "seqpar faster" if hi < 1 else "peer faster")
                    line.append(f"{name[:-3]} {r:.3f} [{lo:.3f}, {hi:.3f}] {verdict}")
                med = [statistics.median(g["step_ms"]) for g in got]
                print(f"N={n} {ours} {med[0]:.1f} ms / {cases[1].label().split(' P=')[0]} "
                      f"{med[1]:.1f} ms: " + "; ".join(line), flush=True)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
