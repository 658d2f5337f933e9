"""Each of seqpar's algorithms beside the peer doing the same thing (the `peers` study's pairs, the same
CPU kernel on both sides), through seqpar's own harness (`workers.bench.measure` on local gloo ranks):
the ratio of median step times seqpar / peer with a 95% bootstrap interval, and forward and
backward apart. Rounds alternate the two sides, so a busy neighbour slows both alike; a ratio whose
interval holds 1 is no measurable difference.

    .venv/bin/python benchmarks/peers_pairs.py --world 2 --seq-len 1024 2048 --rounds 6
"""

from __future__ import annotations

import argparse
import random
import statistics

from seqpar.case import Case
from seqpar.platform.localgang import LocalGang
from seqpar.workers.measure import gang_measure
from seqpar.workers.measure.check import mesh_key

PAIRS = [("ulysses", "peer:yunchang-ulysses", "contiguous", ()),
         ("ring", "peer:torch-cp-ring", "zigzag", (("rotate", "allgather"),)),
         ("ring", "peer:torch-cp-ring", "zigzag", (("rotate", "alltoall"),))]


def step_times(gang: LocalGang, case: Case) -> dict[str, list[float]]:
    """Per timed iteration, the slowest rank's step, forward and backward (ms)."""
    ranks = gang.run(gang_measure, case, size=case.world, mesh=mesh_key(case))
    return {name: [max(v) for v in zip(*(getattr(r, name) for r in ranks), strict=True)]
            for name in ("step_ms", "fwd_ms", "bwd_ms")}


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
    print(f"P={args.world} H={args.heads} D={args.head_dim} B=1 {args.dtype} causal, fwd+bwd; "
          f"{args.rounds} rounds x {args.iters} iterations per side")
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
                for name in ("step_ms", "fwd_ms", "bwd_ms"):
                    r, lo, hi = ratio_interval(got[0][name], got[1][name])
                    verdict = "no measurable difference" if lo <= 1 <= hi else (
                        "seqpar faster" if hi < 1 else "peer faster")
                    line.append(f"{name[:-3]} {r:.3f} [{lo:.3f}, {hi:.3f}] {verdict}")
                med = [statistics.median(g["step_ms"]) for g in got]
                print(f"N={n} {ours} {med[0]:.1f} ms / {cases[1].label().split(' P=')[0]} "
                      f"{med[1]:.1f} ms: " + "; ".join(line))


if __name__ == "__main__":
    main()
