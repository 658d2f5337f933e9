"""Sliding window W = N/8 against full causal attention: step time, FLOPs and bytes per rank, with and
without transfer skipping (option skip_transfers).

    PYTHONPATH=. .venv/bin/python benchmarks/sliding_window.py --seq-len 8192 --world 4 --repeats 3

Local gloo ranks on the CPU (float32, forward + backward). Blocks outside every window get no kernel
call (`layouts.block_tasks`), so the FLOPs fall with W; with skip_transfers the ring schedules also
stop carrying blocks no query ahead sees (`rules/route.py`). "MB sent": the most any rank
sends; "MB skipped": the most any rank's ledger books as skipped (it can exceed the fall of "MB
sent", the busiest rank's); both checked against the analytic counts ("analytic":
`algorithms.expected_bytes(..., layout=, window=)`, `skipped_of_rank`). Step time: the median over
iterations of the slowest rank, then the median over `--repeats` interleaved rounds
(the machine is shared: repeat). `--gbps` emulates every hop as an inter-node link of that speed
(each rank its own node) so that the bytes saved show in the step time.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

from emulated import inter_link, step_ms

from seqpar import algorithms
from seqpar.algorithms import comm
from seqpar.case import Case
from seqpar.platform.localgang import LocalGang
from seqpar.workers.measure import measure

OPTIONS = {"usp": (("dhp", 2),), "double_ring": (("inner_ring", 2),)}
SKIP = ("skip_transfers", True)


def _rank(env, case: Case, link: comm.LinkModel | None, nodes: tuple[int, ...] | None):
    return measure(case, env.rank, env.group(case.world), env.device, nodes=nodes,
                   links=inter_link(link))


def _analytic(case: Case) -> tuple[int, int]:
    """(most bytes any rank sends, most bytes any rank skips) by the analytic counts."""
    opts = dict(case.options)
    mask = {"layout": case.layout, "causal": case.causal, "window": case.window}
    sent = algorithms.expected_bytes(case.algorithm, case.shape, case.world, **mask, **opts)
    spec = algorithms.get(case.algorithm)
    skipped = max(sum(spec.skipped_of_rank(case.shape, case.world, opts, r, algorithms.Mask.of(
        case.shape, case.world, case.layout, case.causal, None, case.window)).values())
        for r in range(case.world))
    return sum(sent.values()), skipped


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds (median reported)")
    ap.add_argument("--algorithms", default="ring")
    ap.add_argument("--layouts", default="zigzag,contiguous")
    ap.add_argument("--gbps", type=float, default=0.0,
                    help="emulate every hop at this many GB/s (0: local speed)")
    args = ap.parse_args()
    n, p = args.seq_len, args.world
    link = comm.LinkModel(0.0, args.gbps * 1e9) if args.gbps else None
    nodes = tuple(range(p)) if link else None
    print(f"N={n} P={p} H={args.heads} D={args.head_dim} float32 fwd+bwd, CPU gloo"
          f"{f', every hop emulated at {args.gbps} GB/s' if link else ''}; window W={n // 8} vs "
          f"full causal; step: median of {args.repeats} rounds (shared machine: noisy)")
    cases = []
    for algo in args.algorithms.split(","):
        for layout in args.layouts.split(","):
            base = Case(algo, p, layout, True, batch=1, seq_len=n, heads=args.heads,
                        kv_heads=args.heads, head_dim=args.head_dim, dtype="float32",
                        warmup=1, iters=args.iters, options=OPTIONS.get(algo, ()))
            for window, skip in ((None, False), (None, True), (n // 8, False), (n // 8, True)):
                opts = tuple(sorted(base.options + ((SKIP,) if skip else ())))
                cases.append(dataclasses.replace(base, window=window, options=opts))
    steps: dict[Case, list[float]] = {c: [] for c in cases}
    last = {}
    with LocalGang(p, device="cpu") as gang:
        for _ in range(args.repeats):
            for case in cases:
                res = gang.run(_rank, case, link, nodes, size=p)
                steps[case].append(step_ms(res))
                last[case] = res
    print(f"{'algorithm':<12} {'layout':<10} {'mask':<16} {'step ms':>8} {'(min-max)':>13} "
          f"{'GFLOP/rank':>10} {'max/mean':>8} {'MB sent':>8} {'MB skipped':>10} {'analytic':>8}")
    for case in cases:
        res = last[case]
        flops = [sum(r.flops.values()) for r in res]
        sent = max(sum(r.bytes_sent.values()) for r in res)
        skipped = max(sum(e["bytes_sent"] for e in r.ledger.get("skipped", [])) for r in res)
        ok = (sent, skipped) == _analytic(case)
        mask = "causal" if case.window is None else f"W={case.window}"
        if dict(case.options).get("skip_transfers"):
            mask += " skip"
        t = steps[case]
        print(f"{case.algorithm:<12} {case.layout:<10} {mask:<16} {statistics.median(t):8.1f} "
              f"{f'({min(t):.0f}-{max(t):.0f})':>13} {max(flops) / 1e9:10.2f} "
              f"{max(flops) / (sum(flops) / p):8.3f} {sent / 1e6:8.2f} {skipped / 1e6:10.2f} "
              f"{'=' if ok else 'DIFFERS':>8}", flush=True)


if __name__ == "__main__":
    main()
