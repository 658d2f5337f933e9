"""Measure this machine into a Cluster (`seqpar calibrate`): what one rank's core does and what the
local transport costs. A few seconds on 2 cores.

Compute is timed in the thread's own CPU time (`time.thread_time`), so other processes on a busy
machine do not count (a rank of a LocalGang or a Ray trial runs one thread); a deterministic
computation takes the least of its repeats, the event-driven costs (messages, thread wake-ups,
the tiny cases below) their median:
- kernel: forward + backward of attention (`kernels.attend`, the kernel the algorithms call) on
  t x t blocks, causal and full, kept as a table (the model interpolates it); the causal rates are
  also summarised as time(t) = c + F(t) (1 + t_half / t) / R (R: `attention_tflops`);
- head dim: the same kernel's time at other head dims over its time at HEAD_DIM (the table's), the
  median over block sizes and both masks (a score's softmax does not shrink with the dim);
- merge: `softmax_merge.merge_into` of a block's partial output, time = merge_us + bytes / rate;
- copy: an accumulation `acc += g` (what gradients and travelling messages cost), bytes / s;
- dispatch: the host's time to issue one operation that launches work (`calibrate.host`);
- linear: forward + backward of a linear layer's mixer outside its projections (the gated DeltaNet
  a CPU rank runs: convolution, norms, gates and torch's chunked delta rule) by head dim, as a
  rate of the rule's FLOPs as `rules.linear` counts them.
Between two local ranks (a LocalGang): the link's wall latency and bandwidth (a ping-pong), and
the ranks' own CPU per message and per byte of an exchange as a ring step makes it (process time:
gloo's threads included). Then what the
others leave over, the fixed host costs of the software per attention call, ring step and
collective: each = (CPU per iteration of a tiny case whose kernels, merges and messages are all
fixed costs: local, ring and ulysses on 1 or 2 ranks) - (the model's prediction of it with the
costs found before it), over the case's calls, steps or collectives.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from seqpar.algorithms.base import AttnShape
from seqpar.algorithms.kernels import attend, attend_backward, attention_flops
from seqpar.algorithms.softmax_merge import merge_into
from seqpar.model.deltanet import DeltaNet
from seqpar.planner.api import predict
from seqpar.planner.clusters import Cluster, Link
from seqpar.rules.linear import LinearShape, delta_rule_flops
from seqpar.rules.model import ModelConfig, param_shapes
from seqpar.sweeps.calibrate.host import dispatch_seconds
from seqpar.workers.measure.probe import probe_seconds

BLOCKS = (64, 128, 256, 512, 1024, 2048, 4096)
MASKS = ("causal", "full")
MERGE_BLOCKS = (64, 256, 1024)
HEADS, HEAD_DIM = 8, 32  # the kernel table's attention shape
DIMS, DIM_BLOCKS = (16, 32, 64, 128), (256, 512, 1024)  # head dims timed against HEAD_DIM
PING_SIZES = (4, 1 << 20, 4 << 20)
LINEAR_DIMS, LINEAR_HEADS, LINEAR_TOKENS = (16, 32, 64, 128), 8, 512  # dk = dv; 8 chunks
STEP_TOKENS = 64  # the tiny cases' sequence: kernels, merges and messages are fixed costs there


def _best(fn: Callable[[], object], repeats: int = 5,
          clock: Callable[[], float] = time.thread_time) -> float:
    """The least time of `repeats` calls after one warm-up, on `clock` (this thread's CPU)."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return min(times)


def kernel_rates(dtype: torch.dtype = torch.float32, blocks: tuple[int, ...] = BLOCKS,
                 sweeps: int = 2, mask: str = "causal") -> dict[int, float]:
    """Block tokens -> sustained FLOP/s of forward + backward under `mask` (t x t blocks) on this
    thread, the best of `sweeps` passes over the blocks (a busy machine's caches slow some)."""
    out: dict[int, float] = {}
    for _ in range(sweeps):
        for t, r in _kernel_pass(dtype, blocks, mask).items():
            out[t] = max(out.get(t, 0.0), r)
    return out


def _kernel_seconds(t: int, head_dim: int, mask: str, dtype: torch.dtype = torch.float32,
                    repeats: int = 5) -> float:
    """The least CPU seconds of forward + backward of a t x t block of HEADS heads of head_dim."""
    q, k, v = (torch.randn(1, t, HEADS, head_dim, dtype=dtype) for _ in range(3))

    def step() -> None:
        o, lse = attend(q, k, v, mask)
        attend_backward(torch.ones_like(o), q, k, v, o, lse, mask)

    return _best(step, repeats=repeats)


def head_dim_times(dims: tuple[int, ...] = DIMS, blocks: tuple[int, ...] = DIM_BLOCKS,
                   sweeps: int = 2) -> dict[int, float]:
    """Head dim -> the kernel's time at it over its time at HEAD_DIM (same tokens and heads): the
    median over `blocks` and both masks of the ratio of the least times of `sweeps` passes over
    the dims (a busy machine's caches slow some passes; HEAD_DIM: 1.0)."""
    ratios: dict[int, list[float]] = {d: [] for d in dims}
    for mask in MASKS:
        for t in blocks:
            times: dict[int, float] = {}
            for _ in range(sweeps):
                for d in sorted({*dims, HEAD_DIM}):
                    times[d] = min(times.get(d, math.inf), _kernel_seconds(t, d, mask, repeats=3))
            for d in dims:
                ratios[d].append(times[d] / times[HEAD_DIM])
    return {d: 1.0 if d == HEAD_DIM else round(statistics.median(r), 3) for d, r in ratios.items()}


def _kernel_pass(dtype: torch.dtype, blocks: tuple[int, ...], mask: str) -> dict[int, float]:
    return {t: 3.5 * attention_flops(1, t, t, HEADS, HEAD_DIM, mask)
            / _kernel_seconds(t, HEAD_DIM, mask, dtype, repeats=3 if t >= 2048 else 5)
            for t in blocks}


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


def fit_line(points: dict[float, float]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through {x: y} (slope kept >= 1e-15)."""
    xs, ys = list(points), list(points.values())
    mx, my = statistics.mean(xs), statistics.mean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0
    slope = max(slope, 1e-15)
    return max(0.0, my - slope * mx), slope


def merge_times(blocks: tuple[int, ...] = MERGE_BLOCKS) -> dict[int, float]:
    """Bytes of a block's partial output (float32) -> seconds of one merge into accumulators."""
    out = {}
    for t in blocks:
        o, acc = torch.randn(1, t, HEADS, HEAD_DIM), torch.randn(1, t, HEADS, HEAD_DIM)
        lse, acc_lse = torch.randn(1, HEADS, t), torch.randn(1, HEADS, t)
        out[o.numel() * o.element_size()] = _best(lambda o=o, a=acc, lo=lse, la=acc_lse:
                                                  merge_into(a, la, o, lo), repeats=9)
    return out


def copy_rate(tokens: int = 1024) -> float:
    """Bytes per second of an accumulation acc += g (float32) on this thread."""
    acc, g = torch.randn(1, tokens, HEADS, HEAD_DIM), torch.randn(1, tokens, HEADS, HEAD_DIM)
    return acc.numel() * acc.element_size() / _best(lambda: acc.add_(g), repeats=9)


def gemm_rate(dtype: torch.dtype = torch.float32, n: int = 512) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    return 2 * n ** 3 / _best(lambda: a @ b)


# the tiny cases, in the order their residuals are taken: a call (local), a ring step (ring on 2
# ranks: 2 x 2 steps), a collective (ulysses: four all-to-alls)
TINY = ("local", "ring", "ulysses")
FIXED = {"local": ("call_us", 1), "ring": ("step_us", 4), "ulysses": ("collective_us", 4)}


def linear_rates(dims: tuple[int, ...] = LINEAR_DIMS) -> dict[int, float]:
    """FLOP/s of a linear layer's mixer outside its projections (`model.deltanet.DeltaNet` on one
    process: the short convolution, the norms and gates, the chunked rule), forward + backward, by
    head dim d: LINEAR_HEADS value heads and half as many key heads of d (Qwen3-Next's), hidden
    heads x d, over LINEAR_TOKENS tokens; its time less its three projections' (the planner's
    GEMMs), over 3x the rule's FLOPs (`delta_rule_flops`); the least of 3 repeats."""
    out = {}
    gen = torch.Generator().manual_seed(0)
    h, n = LINEAR_HEADS, LINEAR_TOKENS
    mixer = DeltaNet()
    for d in dims:
        cfg = ModelConfig(vocab=2, hidden=h * d, layers=1, heads=h, kv_heads=h, ffn=2,
                          family="qwen3_next", layer_types=("linear",), lin_k_heads=h // 2,
                          lin_v_heads=h, lin_k_dim=d, lin_v_dim=d, conv_kernel=4)
        p = {k.split(".")[-1]: (0.1 * torch.randn(*shape, generator=gen)).requires_grad_()
             for k, shape in param_shapes(cfg).items() if ".lin_" in k}
        x = torch.randn(1, n, cfg.hidden, generator=gen, requires_grad=True)

        def run(x=x, p=p, cfg=cfg) -> None:
            mixer(x, p, cfg).sum().backward()

        def projections(x=x, p=p, cfg=cfg) -> None:
            o = torch.zeros(1, n, cfg.lin_v_heads * cfg.lin_v_dim, requires_grad=True)
            ys = [F.linear(x, p["lin_qkvz"]), F.linear(x, p["lin_ba"]), F.linear(o, p["lin_out"])]
            sum(y.sum() for y in ys).backward()

        rest = _best(run, repeats=3) - _best(projections, repeats=3)
        out[d] = 3 * delta_rule_flops(LinearShape.of(cfg, 1, 4), n) / max(rest, 1e-9)
    return out


def fixed_costs(cluster: Cluster, tiny: dict[str, float]) -> Cluster:
    """`cluster` with its fixed host costs per call, ring step and collective: each tiny case's CPU
    per iteration less the model's prediction of it with the costs found before it, over its
    calls, steps or collectives."""
    free = Link(bandwidth_gb_per_s=1e9, latency_us=0.0)
    shape = AttnShape(1, STEP_TOKENS, HEADS, HEADS, HEAD_DIM, 4)
    for name in TINY:
        field, count = FIXED[name]
        alone = cluster.model_copy(update={"cores": None, "intra": free, "inter": free, field: 0.0})
        modelled = predict(alone, name, shape, 1 if name == "local" else 2, layout="contiguous",
                           dtype="float32").attention_ms / 1e3
        residual = max(0.0, tiny[name] - modelled) / count
        cluster = cluster.model_copy(update={field: round(residual * 1e6, 1)})
    return cluster


def cores() -> int:
    """The cores this process may run on (its CPU affinity; the machine's count elsewhere)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def measure(name: str = "local") -> tuple[Cluster, dict[str, dict[int, float]]]:
    """This machine's compute as a Cluster (one node; ranks are one-thread processes sharing its
    cores), and the kernel's FLOP/s by mask and block tokens. The link between two local ranks
    needs ranks: `seqpar.sweeps.calibrate` measures it and `with_host_links` folds it in."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # what one rank of a LocalGang or a Ray trial gets
    probes = [probe_seconds()]  # the host's speed beside each rate (`Cluster.probe_ms`)
    try:
        table = {mask: kernel_rates(mask=mask) for mask in MASKS}
        probes.append(probe_seconds())
        by_dim = head_dim_times()
        merge_us, merge_slope = fit_line({float(b): s for b, s in merge_times().items()})
        copy = copy_rate()
        gemm = gemm_rate()
        probes.append(probe_seconds())
        linear = linear_rates()
        dispatch, _ = dispatch_seconds()
        probes.append(probe_seconds())
    finally:
        torch.set_num_threads(threads)
    peak, half, _ = fit_rate(table["causal"])
    n = cores()
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    cluster = Cluster(
        name=name, nodes=1, gpus_per_node=8,
        source=f"seqpar calibrate on {platform.node()} ({n} cores, torch {torch.__version__}), "
               f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; ranks share the cores",
        attention_tflops={"float32": round(peak / 1e12, 6)},
        gemm_tflops={"float32": round(gemm / 1e12, 6)},
        kernel_half_tokens=half, memory_gb=round(mem, 1),
        attention_tflops_by_block={m: {t: round(r / 1e12, 6) for t, r in rates.items()}
                                   for m, rates in table.items()},
        attention_time_by_dim=by_dim,
        linear_tflops_by_dim={d: round(r / 1e12, 6) for d, r in linear.items()},
        intra=Link(bandwidth_gb_per_s=1.0, latency_us=50.0), nics_per_node=1,
        inter=Link(bandwidth_gb_per_s=1.0, latency_us=50.0), cores=n,
        merge_gb_per_s=round(1 / merge_slope / 1e9, 3), merge_us=round(merge_us * 1e6, 1),
        copy_gb_per_s=round(copy / 1e9, 3), dispatch_us=round(dispatch * 1e6, 2),
        probe_ms=round(min(probes) * 1e3, 3))
    return cluster, table


def with_host_links(cluster: Cluster, link: Link, transport_bytes_per_s: float,
                    per_message_s: float, tiny: dict[str, float]) -> Cluster:
    """`cluster` with the local link, the transport's CPU cost and the fixed host costs found from
    the TINY cases' CPU per iteration (what `seqpar.sweeps.calibrate.ranks.host_links` measures)."""
    return fixed_costs(cluster.model_copy(update={
        "intra": link, "inter": link, "transport_gb_per_s": round(transport_bytes_per_s / 1e9, 3),
        "message_us": round(per_message_s * 1e6, 1)}), tiny)
