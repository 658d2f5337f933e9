"""Why seqpar's ring trails torch's context-parallel ring on CPU (gloo) at P = 2: the same ring with
its point-to-point exchange (`Comm.exchange`: batch_isend_irecv) swapped, in this process only, for
one all_to_all_single with splits, the collective torch's alltoall rotation (`permute_tensor`)
runs; beside torch's ring. Median and least step (slowest rank) and the ranks' CPU per pass.

    .venv/bin/python benchmarks/peers_ring_exchange.py 1024 6     # N, rounds
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.distributed as dist

from seqpar.algorithms import comm as comm_mod
from seqpar.case import Case
from seqpar.platform.localgang import LocalGang
from seqpar.workers.measure.attention import build, local_inputs
from seqpar.workers.measure.check import mesh_key
from seqpar.workers.measure.timing import timed_pass

ORIG = comm_mod.Comm.exchange


def a2a_exchange(self, sends, recvs, tag=0):
    """Comm.exchange of one tensor each way between two ranks, as one all_to_all_single."""
    if self.size != 2 or len(sends) != 1 or len(recvs) != 1:
        return ORIG(self, sends, recvs, tag)
    (t, peer), (buf, src) = sends[0], recvs[0]
    self._book("p2p", {peer: t.numel() * t.element_size()})
    send, out = t.contiguous().reshape(-1), buf.reshape(-1)
    n, m = send.numel(), out.numel()
    work = dist.all_to_all_single(out, send,
                                  output_split_sizes=[m if i == src else 0 for i in range(2)],
                                  input_split_sizes=[n if i == peer else 0 for i in range(2)],
                                  group=self.group, async_op=True)
    return comm_mod.Handle([work], [buf], 0.0, time.perf_counter())


def passes(env, case: Case, patched: bool, iters: int) -> list[tuple[float, float]]:
    torch.set_num_threads(1)
    comm_mod.Comm.exchange = a2a_exchange if patched else ORIG  # this rank process only
    group = env.group(case.world)
    attn = build(case, group, env.mesh)
    q, k, v, dout = local_inputs(case, env.rank, torch.device("cpu"))
    out = []
    for i in range(2 + iters):
        c = time.process_time()
        f, b, _ = timed_pass(attn, (q, k, v), dout, {}, group, torch.device("cpu"))
        if i >= 2:
            out.append((f + b, time.process_time() - c))
    comm_mod.Comm.exchange = ORIG
    return out


SIDES = (("ring (gloo p2p)", "ring", (), False), ("ring (exchange as all_to_all)", "ring", (), True),
         ("torch-cp-ring allgather", "peer:torch-cp-ring", (("rotate", "allgather"),), False))


def main() -> None:
    n, rounds = int(sys.argv[1]), int(sys.argv[2])
    res: dict[str, list[tuple[float, float]]] = {}
    with LocalGang(2, sizes=(2,), device="cpu") as gang:
        for _ in range(rounds):
            for label, name, opts, patched in SIDES:
                case = Case(name, 2, "zigzag", True, batch=1, seq_len=n, heads=8, kv_heads=8,
                            head_dim=32, dtype="float32", options=opts)
                r = gang.run(passes, case, patched, 5, size=2, mesh=mesh_key(case))
                for a, b in zip(*r, strict=True):
                    res.setdefault(label, []).append((max(a[0], b[0]), (a[1] + b[1]) / 2))
    for label, v in res.items():
        walls, cpus = [w for w, _ in v], [c for _, c in v]
        print(f"N={n} {label}: step wall median {statistics.median(walls) * 1e3:.1f} ms (least "
              f"{min(walls) * 1e3:.1f}), CPU per pass median {statistics.median(cpus) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
