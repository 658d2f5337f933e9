"""Measure this machine into a Cluster: attention kernel rate by block size, GEMM rate, and the
latency and bandwidth between two local ranks (a LocalGang ping-pong). A minute or two on 2 cores.

Kernel: forward + backward of causal attention (`kernels.attend`, the kernel the algorithms call) on
blocks of t tokens; rate(t) = R * t / (t + t_half) is fitted through 1/rate = 1/R + (t_half/R)/t.
"""

from __future__ import annotations

import os
import platform
import time

import torch

from seqpar.algorithms.kernels import attend, attend_backward, attention_flops
from seqpar.experiments.clusters import Cluster, Link

BLOCKS = (64, 128, 256, 512, 1024, 2048)
HEADS, HEAD_DIM = 8, 32  # the `tiny` preset's attention shape


def _best(fn, repeats: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def kernel_rates(dtype: torch.dtype = torch.float32,
                 blocks: tuple[int, ...] = BLOCKS) -> dict[int, float]:
    """Block tokens -> sustained FLOP/s of causal forward + backward."""
    out = {}
    for t in blocks:
        q, k, v = (torch.randn(1, t, HEADS, HEAD_DIM, dtype=dtype) for _ in range(3))

        def step(q=q, k=k, v=v):
            o, lse = attend(q, k, v, "causal")
            attend_backward(torch.ones_like(o), q, k, v, o, lse, "causal")

        flops = 3.5 * attention_flops(1, t, t, HEADS, HEAD_DIM, "causal")
        out[t] = flops / _best(step)
    return out


def fit_rate(rates: dict[int, float]) -> tuple[float, int, float]:
    """(R FLOP/s, t_half tokens, call overhead s) of time(t) = c + F(t) (1 + t_half/t) / R, the
    least relative error in time over a grid of (c, t_half), R in closed form for each."""
    flops = {t: 3.5 * attention_flops(1, t, t, HEADS, HEAD_DIM, "causal") for t in rates}
    times = {t: flops[t] / r for t, r in rates.items()}
    best = (float("inf"), 1.0, 0, 0.0)
    for c in [i * 1e-5 for i in range(0, 200)]:
        if c >= min(times.values()):
            break
        for half in range(0, 4097, 32):
            a = {t: flops[t] * (1 + half / t) for t in rates}
            x = sum(a[t] * (times[t] - c) / times[t] ** 2 for t in rates) / \
                sum((a[t] / times[t]) ** 2 for t in rates)
            if x <= 0:
                continue
            err = sum(((c + a[t] * x - times[t]) / times[t]) ** 2 for t in rates)
            if err < best[0]:
                best = (err, 1 / x, half, c)
    return best[1], best[2], best[3]


def gemm_rate(dtype: torch.dtype = torch.float32, n: int = 512) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    return 2 * n ** 3 / _best(lambda: a @ b)


def _pingpong(env, sizes: tuple[int, ...], repeats: int) -> dict[int, float]:
    import torch.distributed as dist

    out = {}
    for n in sizes:
        buf = torch.zeros(n // 4, dtype=torch.float32)
        times = []
        for _ in range(repeats + 1):
            dist.barrier()
            t0 = time.perf_counter()
            if env.rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            else:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            times.append((time.perf_counter() - t0) / 2)
        out[n] = min(times[1:])
    return out


def link(repeats: int = 10) -> Link:
    """Latency (a 4-byte message) and bandwidth (16 MB) between two local gloo ranks."""
    from seqpar.platform.localgang import LocalGang

    sizes = (4, 1 << 20, 16 << 20)
    with LocalGang(2, device="cpu") as gang:
        one_way = gang.run(_pingpong, sizes, repeats)[0]
    latency = one_way[4]
    bandwidth = (sizes[2] - sizes[1]) / max(one_way[sizes[2]] - one_way[sizes[1]], 1e-9)
    return Link(bandwidth_gb_per_s=round(bandwidth / 1e9, 3), latency_us=round(latency * 1e6, 1))


def measure(name: str = "local", with_link: bool = True) -> tuple[Cluster, dict[int, float]]:
    """This machine as a Cluster (one node; ranks are one-thread processes sharing its cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # what one rank of a LocalGang or a Ray trial gets
    try:
        rates = kernel_rates()
    finally:
        torch.set_num_threads(threads)
    peak, half, call = fit_rate(rates)
    gemm = gemm_rate()
    lk = link() if with_link else Link(bandwidth_gb_per_s=1.0, latency_us=50.0)
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    cores = os.cpu_count() or 1
    cluster = Cluster(
        name=name, nodes=1, gpus_per_node=8,
        source=f"seqpar calibrate on {platform.node()} ({cores} cores, torch {torch.__version__}), "
               f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; ranks share the cores",
        attention_tflops={"float32": round(peak / 1e12, 6)},
        gemm_tflops={"float32": round(gemm / 1e12, 6)},
        kernel_half_tokens=half, kernel_call_us=round(call * 1e6, 1), memory_gb=round(mem, 1),
        intra=lk, nics_per_node=1, inter=lk, cores=cores)
    return cluster, rates
