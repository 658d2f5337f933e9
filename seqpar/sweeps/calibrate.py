"""`seqpar calibrate`'s measurements that need ranks, and the whole calibration: the link between
two local gloo ranks (a ping-pong: wall latency and bandwidth, CPU per message and per byte) and
the CPU per iteration of the tiny cases, folded into the compute rates
`seqpar.experiments.perf.calibrate` measures on one thread (see its docstring for the method).
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import torch
import torch.distributed as dist

from seqpar.case import Case
from seqpar.experiments.clusters import Cluster, Link
from seqpar.experiments.perf.calibrate import (
    HEAD_DIM,
    HEADS,
    PING_SIZES,
    STEP_TOKENS,
    TINY,
    measure,
    with_host_links,
)
from seqpar.platform.localgang import LocalGang
from seqpar.workers.measure import measure as measure_case


def _pingpong(env, sizes: tuple[int, ...], repeats: int) -> dict[int, tuple[float, float]]:
    """Bytes -> (one-way wall seconds of a ping-pong, least of `repeats`; this rank's CPU seconds
    per exchange, median of `repeats`). An exchange is what a ring step does: post a send of the
    block and a receive into a fresh buffer, wait for both."""
    torch.set_num_threads(1)
    out = {}
    peer = 1 - env.rank
    for n in sizes:
        buf = torch.zeros(max(1, n // 4), dtype=torch.float32)
        walls, cpus = [], []
        for _ in range(repeats + 1):
            dist.barrier()
            t0 = time.perf_counter()
            if env.rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            else:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            walls.append((time.perf_counter() - t0) / 2)
            dist.barrier()
            c0 = time.process_time()
            ops = [dist.P2POp(dist.isend, buf, peer),
                   dist.P2POp(dist.irecv, torch.empty_like(buf), peer)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()
            cpus.append(time.process_time() - c0)
        out[n] = (min(walls[1:]), statistics.median(cpus[1:]))
    return out


def _case_cpu(env, case: Case, iters: int) -> float:
    """This rank's CPU seconds (all its threads) per iteration of `case`, median of iters."""
    torch.set_num_threads(1)
    group = env.group(case.world)
    measure_case(dataclasses.replace(case, warmup=1, iters=1), env.rank, group, env.device)
    cpus = []
    for _ in range(iters):
        c0 = time.process_time()
        # one memory-metered and one timed iteration (the measurement loop's protocol): two per call
        measure_case(dataclasses.replace(case, warmup=0, iters=1), env.rank, group,
                     env.device)
        cpus.append((time.process_time() - c0) / 2)
    return statistics.median(cpus)


def host_links(repeats: int = 10) -> tuple[Link, float, float, dict[str, float]]:
    """(link, transport bytes/s, seconds per message, tiny cases' CPU per iteration) between two
    local gloo ranks: wall latency (4 bytes) and bandwidth (1 MB to 4 MB); CPU per message (half a
    4-byte round trip) and per byte; CPU per iteration of the TINY cases on 1 or 2 ranks."""
    small, mid, big = PING_SIZES
    with LocalGang(2, sizes=(1, 2), device="cpu") as gang:
        pings = gang.run(_pingpong, PING_SIZES, repeats)
        tiny = {}
        for name in TINY:
            world = 1 if name == "local" else 2
            case = Case(name, world, batch=1, seq_len=STEP_TOKENS, heads=HEADS, kv_heads=HEADS,
                        head_dim=HEAD_DIM, dtype="float32")
            tiny[name] = max(gang.run(_case_cpu, case, 21, size=world))
    wall = {n: max(p[n][0] for p in pings) for n in PING_SIZES}
    cpu = {n: statistics.mean(p[n][1] for p in pings) for n in PING_SIZES}
    bandwidth = (big - mid) / max(wall[big] - wall[mid], 1e-9)
    # per exchange a rank sends one message and receives one: 2 messages, 2 x n bytes
    per_message = cpu[small] / 2
    per_byte = max(cpu[big] - cpu[small], 1e-9) / (2 * (big - small))
    lk = Link(bandwidth_gb_per_s=round(bandwidth / 1e9, 3), latency_us=round(wall[small] * 1e6, 1))
    return lk, 1 / per_byte, per_message, tiny


def calibrate(name: str = "local",
              with_link: bool = True) -> tuple[Cluster, dict[str, dict[int, float]]]:
    """This machine as a Cluster (one node; ranks are one-thread processes sharing its cores) and
    the kernel's FLOP/s by mask and block tokens; with `with_link`, also the local link, the
    transport's CPU cost and the fixed host costs (two local ranks)."""
    cluster, table = measure(name)
    if with_link:
        cluster = with_host_links(cluster, *host_links())
    return cluster, table
