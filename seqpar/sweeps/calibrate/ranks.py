"""`seqpar calibrate`'s measurements that need ranks, and the whole calibration: the link between
two local gloo ranks (a ping-pong: wall latency and bandwidth, CPU per message and per byte) and
the CPU per iteration of the tiny cases, folded into the compute rates
`seqpar.sweeps.calibrate.compute` measures on one thread (see its docstring for the method).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from seqpar.case import Case
from seqpar.planner.clusters import Cluster, KernelRate, Link
from seqpar.platform.localgang import LocalGang
from seqpar.rules.flops import BACKWARD_FLOPS, attention_flops
from seqpar.sweeps.calibrate.compute import (
    HEAD_DIM,
    HEADS,
    PING_SIZES,
    STEP_TOKENS,
    TINY,
    measure,
    with_host_links,
)
from seqpar.sweeps.calibrate.host import step_waits
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


# ----------------------------------------------------------------- attention kernels on CUDA
CUDA_SHAPE = (1, 16384, 16, 128)  # (batch, tokens, heads, head dim): the microbenchmarks' 16K calls


def _sdpa(backend: str) -> Callable | None:
    """torch SDPA pinned to one backend, on (B, N, H, D) tensors."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    which = {"sdpa-flash": SDPBackend.FLASH_ATTENTION, "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
             "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION}[backend]

    def run(q, k, v, causal):
        with sdpa_kernel([which]):
            out = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal)
        return out.transpose(1, 2)

    return run


def _flash(version: int) -> Callable | None:
    """flash-attn's own function (2: flash_attn; 3: flash_attn_interface), or None when absent."""
    try:
        if version == 2:
            from flash_attn import flash_attn_func
        else:
            from flash_attn_interface import flash_attn_func
    except ImportError:
        return None

    def run(q, k, v, causal):
        out = flash_attn_func(q, k, v, causal=causal)
        return out[0] if isinstance(out, tuple) else out

    return run


def _cuda_seconds(fn: Callable[[], object], repeats: int = 10) -> float:
    """The median of `repeats` timed calls (CUDA events), after two warm ones."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def _kernel_rate(run: Callable, dtype: torch.dtype) -> KernelRate:
    """One kernel's forward (no mask, causal) and backward TFLOP/s on CUDA_SHAPE."""
    b, n, h, d = CUDA_SHAPE
    q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=dtype, requires_grad=True)
               for _ in range(3))
    grad = torch.randn(b, n, h, d, device="cuda", dtype=dtype)
    full, causal = (attention_flops(b, n, n, h, d, m) for m in ("full", "causal"))
    forward = _cuda_seconds(lambda: run(q, k, v, False))
    masked = _cuda_seconds(lambda: run(q, k, v, True))
    both = _cuda_seconds(lambda: run(q, k, v, False).backward(grad))
    return KernelRate(
        forward_full=round(full / forward / 1e12, 1), forward_causal=round(causal / masked / 1e12, 1),
        backward=round(BACKWARD_FLOPS * full / max(both - forward, 1e-9) / 1e12, 1),
        source=f"seqpar calibrate on {torch.cuda.get_device_name()}, torch {torch.__version__}: "
               f"B={b} N={n} H={h} D={d} {str(dtype).removeprefix('torch.')}")


def cuda_kernels(dtype: torch.dtype = torch.bfloat16) -> dict[str, KernelRate]:
    """Each attention kernel this CUDA machine runs, measured as the planner's rates are stated:
    forward TFLOP/s without and with the causal mask and backward TFLOP/s at 16K-token calls
    (FLOPs as rules.flops counts them). A kernel that cannot run here is left out."""
    runs = {"flash2": _flash(2), "flash3": _flash(3),
            **{k: _sdpa(k) for k in ("sdpa-flash", "sdpa-cudnn", "sdpa-efficient")}}
    out = {}
    for name, run in runs.items():
        if run is None:
            continue
        try:
            out[name] = _kernel_rate(run, dtype)
        except RuntimeError:  # no kernel of this backend for this GPU, dtype or shape
            continue
    return out


def calibrate(name: str = "local",
              with_link: bool = True) -> tuple[Cluster, dict[str, dict[int, float]]]:
    """This machine as a Cluster (one node; ranks are one-thread processes sharing its cores) and
    the kernel's FLOP/s by mask and block tokens; with `with_link`, also the local link, the
    transport's CPU cost, the fixed host costs and what a training step's messages and collectives
    cost beyond them, the CPU their transport's threads take and the spread of ranks side by side
    (`host.step_waits`; two local ranks); on a CUDA machine also every
    attention kernel it runs (`Cluster.kernels`: the planner takes them before documented rates)."""
    cluster, table = measure(name)
    if with_link:
        cluster = with_host_links(cluster, *host_links())
        waits, transport, spreads = {}, {}, {}
        for world in sorted({2, 2 * (cluster.cores or 1)}):  # ranks a core, and two a core
            wait, cpu, spread = step_waits(cluster, world=world)
            waits[world] = tuple(round(s * 1e6, 1) for s in wait)
            transport[world] = tuple(round(s * 1e6, 1) for s in cpu)
            spreads[world] = round(spread, 4)
        cluster = cluster.model_copy(update={"waits_us": waits, "transport_cpu_us": transport,
                                             "spread": spreads})
    if torch.cuda.is_available():
        cluster = cluster.model_copy(update={"kernels": cuda_kernels()})
    return cluster, table
