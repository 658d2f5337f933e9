"""burst's topology-aware ring and WallFacer (C = 2, both placements) against the plain ring at P = 8
on virtual nodes (default 2 x 4) with an emulated inter-node link.

    .venv/bin/python benchmarks/wallfacer_burst.py --latency-ms 5 --bandwidth-mb-s 10
    .venv/bin/python benchmarks/wallfacer_burst.py --ranks-per-node 2     # 4 nodes x 2

Eight local gloo ranks; node = rank // ranks-per-node (the mesh's node map, which is also where burst
learns its node map), and every inter-node transfer lasts at least latency + bytes / bandwidth
(`measure(..., links=)`); intra-node transfers run at local speed. Causal, zigzag, forward +
backward, float32; the median over the timed iterations of the slowest rank's step (best of
`--rounds` interleaved rounds, since other load on the machine only ever adds time), the most bytes
any rank sends (forward / backward, and across nodes), the bytes one forward saves for backward
(`SavedTensorMeter`, the activations of WallFacer Eq. 9-10) and the trial's resident-memory peak
(`MemoryMeter`; at these sizes mostly allocator noise). Ratios are ring's step time over the contender's.
"""

from __future__ import annotations

import argparse
import dataclasses

from emulated import inter_link, most_bytes, step_ms

from seqpar import algorithms
from seqpar.algorithms import comm
from seqpar.case import Case
from seqpar.platform.localgang import LocalGang
from seqpar.workers.measure import measure
from seqpar.workers.measure.attention import local_inputs
from seqpar.workers.measure.meters import SavedTensorMeter


def _rank(env, case: Case, nodes: list[int], link: comm.LinkModel | None):
    links = inter_link(link)
    result = measure(case, env.rank, env.group(case.world), env.device, nodes=nodes, links=links)
    q, k, v, _ = (t.requires_grad_() for t in local_inputs(case, env.rank, env.device))
    attn = algorithms.build_attention(case.algorithm, causal=case.causal, layout=case.layout,
                                      group=env.group(case.world), nodes=nodes, links=links,
                                      **case.option_dict)
    with SavedTensorMeter() as saved:  # what one forward keeps for backward (Eq. 9-10)
        attn(q, k, v)
    return result, saved.nbytes


def contenders(base: Case) -> dict[str, Case]:
    def like(algorithm: str, **options) -> Case:
        return dataclasses.replace(base, algorithm=algorithm, options=tuple(sorted(options.items())))
    return {"ring": base, "burst": like("burst"),
            "wallfacer C=2 collective-intra": like("wallfacer", team_size=2,
                                                   placement="collective-intra"),
            "wallfacer C=2 p2p-intra": like("wallfacer", team_size=2, placement="p2p-intra")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--ranks-per-node", type=int, default=4)
    parser.add_argument("--latency-ms", type=float, default=5.0)
    parser.add_argument("--bandwidth-mb-s", type=float, default=10.0)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    nodes = [r // args.ranks_per_node for r in range(8)]
    link = comm.LinkModel(args.latency_ms / 1e3, args.bandwidth_mb_s * 1e6)
    base = Case("ring", 8, "zigzag", True, batch=1, seq_len=args.seq_len, heads=args.heads,
                kv_heads=args.kv_heads, head_dim=args.head_dim, dtype="float32", warmup=1,
                iters=args.iters)
    kv_bytes = 2 * base.kv_heads * base.shape.unit(8)
    print(f"P=8 on {8 // args.ranks_per_node} nodes x {args.ranks_per_node}, causal zigzag, "
          f"N={args.seq_len} H={args.heads}/{args.kv_heads} D={args.head_dim} float32; "
          f"K,V shard message {kv_bytes / 1e6:.2f} MB")
    print(f"inter-node link: {args.latency_ms} ms + bytes / {args.bandwidth_mb_s} MB/s "
          f"({link.seconds(kv_bytes) * 1e3:.1f} ms per K,V shard); intra-node: local speed")
    times: dict[tuple[str, bool], float] = {}
    with LocalGang(8, device="cpu") as gang:
        for emulated in (False, True):
            rows = {}
            for _ in range(args.rounds):  # interleaved rounds; the best round resists other load
                for name, case in contenders(base).items():
                    runs = gang.run(_rank, case, nodes, link if emulated else None)
                    results = [r for r, _ in runs]
                    ms = step_ms(results)
                    if ms < times.get((name, emulated), float("inf")):
                        times[(name, emulated)], rows[name] = ms, runs
            for name, runs in rows.items():
                results = [r for r, _ in runs]
                saved = max(s for _, s in runs) / 2**20
                peak = max(r.peak_mem_bytes for r in results) / 2**20
                print(f"  {'emulated' if emulated else 'local':>8}  {name:<31} step "
                      f"{times[(name, emulated)]:8.1f} ms  bytes/rank fwd "
                      f"{most_bytes(results, phase='forward'):>8} bwd "
                      f"{most_bytes(results, phase='backward'):>8} inter "
                      f"{most_bytes(results, link='inter'):>8}  saved {saved:5.2f} MiB  rss peak "
                      f"{peak:5.1f} MiB")
    for emulated in (False, True):
        for name in contenders(base):
            if name != "ring":
                ratio = times[("ring", emulated)] / times[(name, emulated)]
                print(f"ring / {name} step time, {'with' if emulated else 'without'} the "
                      f"inter-node emulation: {ratio:.2f}x")


if __name__ == "__main__":
    main()
