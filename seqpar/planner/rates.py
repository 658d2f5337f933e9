"""Kernel rates from documented microbenchmarks: the attention kernel that will run (by name, head
dim and dtype) and GEMMs by shape, per GPU. Each number names its source; none is fitted to a
paper's end-to-end table. Measured numbers in a cluster file (`Cluster.kernels`, written by
`seqpar calibrate` on that cluster) take precedence.

    cluster, source = with_kernel(clusters.load("h100-sxm"), "flash2", head_dim=128)

Attention: TFLOP/s at large blocks (16K-token calls) of the forward without and with a causal mask
and of the backward, counted as the benchmarks count them (forward 4·N²·H·D, halved when causal;
backward 2.5x forward: `seqpar.rules.flops`). Small calls run slower by the cluster's
`kernel_half_tokens` curve.
"""

from __future__ import annotations

from dataclasses import dataclass

from seqpar.errors import require
from seqpar.planner.clusters import Cluster, KernelRate

KERNELS = ("flash2", "flash3", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient")
DEFAULT_KERNEL = "flash2"  # what `make gpu-check`'s install runs (flash-attn 2)
SIXTEEN_BIT = ("bfloat16", "float16")

FA3 = ("FlashAttention-3 (Shah et al. 2024, arXiv 2407.08608) Fig. 4-5: H100 80GB SXM5, 16-bit, "
       "16K tokens a call, batch x seqlen = 16K, hidden 2048")
TORCH_SDPA = ("pytorch/benchmark#2296 (H100, head dim 128): torch SDPA's flash backend (vendored "
              "FlashAttention-2 kernels) 287-304 TFLOP/s forward where FlashAttention-2 itself "
              "runs 350-370 (FA3 Fig. 4): 0.82x flash2")


@dataclass(frozen=True)
class Documented:
    """A kernel's forward rate (no mask) by head dim, with the causal and backward ratios measured
    at head dim 128 (applied at every head dim), and the source of each."""

    forward_full: dict[int, float]
    causal_ratio: float
    backward_ratio: float
    source: str

    def at(self, head_dim: int, scale: float = 1.0) -> KernelRate:
        dims = sorted(self.forward_full)
        near = min(dims, key=lambda d: (abs(d - head_dim), d))
        f = self.forward_full[near] * scale
        return KernelRate(forward_full=round(f, 1), forward_causal=round(f * self.causal_ratio, 1),
                          backward=round(f * self.backward_ratio, 1),
                          source=f"{self.source} (head dim {near}"
                                 + (f", asked {head_dim}" if near != head_dim else "") + ")")


# H100 SXM5, FA3 Fig. 4 (forward, no mask / causal) and Fig. 5 (backward, no mask), 16K tokens:
#   flash2   hd64 324 | hd128 370, causal 335, bwd 322 | hd256 326
#   flash3   hd64 497 | hd128 648, causal 616, bwd 561 | hd256 756
#   cuDNN    hd64 413 | hd128 595, causal 539, bwd 516 | hd256 581
_H100 = {
    "flash2": Documented({64: 324.0, 128: 370.0, 256: 326.0}, 335 / 370, 322 / 370, FA3),
    "flash3": Documented({64: 497.0, 128: 648.0, 256: 756.0}, 616 / 648, 561 / 648, FA3),
    "sdpa-cudnn": Documented({64: 413.0, 128: 595.0, 256: 581.0}, 539 / 595, 516 / 595,
                             FA3 + "; torch's cuDNN backend runs cuDNN's fused attention"),
}
SCALE = {"sdpa-flash": ("flash2", 0.82, TORCH_SDPA),
         # an estimate, not a measurement: xformers' cutlass kernel (torch's memory-efficient
         # backend) is FlashAttention-1's algorithm, which FlashAttention-2 runs 2x faster (Dao 2023,
         # abstract and Fig. 4); re-measure with `seqpar calibrate` on the cluster
         "sdpa-efficient": ("flash2", 0.5, "estimate: FlashAttention-2 (Dao 2023) is ~2x "
                            "FlashAttention-1-class kernels such as xformers' cutlass; 0.5x flash2")}

# GPU -> kernel -> documented rates. H200: the H100's SMs and clocks (989 TFLOP/s bf16 dense, same
# datasheet): compute-bound kernels run at the H100's rates; its faster HBM changes what is
# memory-bound (the cluster's memory_gb_per_s), not these.
TABLE: dict[str, dict[str, Documented]] = {"h100": _H100, "h200": _H100}
# flash-attn 3 and cuDNN's fused attention need Hopper; on Ampere the cluster's own rate is
# FlashAttention-2's (clusters.FLASH_EFFICIENCY)
NOT_ON = {"a100": {"flash3": "FlashAttention-3 runs on Hopper only"}}

# GEMMs: the largest of a sweep of matmul shapes (Maximum Achievable Matmul FLOPS, ml-engineering
# compute/accelerator README, bf16): A100 SXM 267.9 of 312 (85.9%), H100 SXM 792.1 of 989 (80.1%)
# at shapes whose smallest dim is 1.5K-2.8K. A smaller dim leaves tensor cores idle (wave
# quantization): rate x d / (d + GEMM_HALF_DIM), relative to the best shape's smallest dim.
GEMM_HALF_DIM = 128   # an estimate: one 128-row tile per SM wave; no sweep below 1K was published
MAMF_DIM = 2048


def gemm_rate(cluster: Cluster, dtype: str, smallest_dim: float) -> float:
    """FLOP/s of a GEMM whose smallest dimension is `smallest_dim` (the cluster's sustained GEMM
    rate at the best shape, falling for small dims on a GPU)."""
    rate = cluster.rate(dtype, "gemm")
    if cluster.gpu is None or smallest_dim <= 0:
        return rate
    f = (smallest_dim / (smallest_dim + GEMM_HALF_DIM)) / (MAMF_DIM / (MAMF_DIM + GEMM_HALF_DIM))
    return rate * min(1.0, f)


def documented(gpu: str | None, kernel: str, head_dim: int) -> KernelRate | None:
    """The documented rate of `kernel` on `gpu` at `head_dim`, or None."""
    table = TABLE.get(gpu or "")
    if table is None:
        return None
    if kernel in SCALE:
        base, scale, source = SCALE[kernel]
        got = table[base].at(head_dim, scale)
        return KernelRate(forward_full=got.forward_full, forward_causal=got.forward_causal,
                          backward=got.backward, source=f"{source}; {got.source}")
    return table[kernel].at(head_dim) if kernel in table else None


def with_kernel(cluster: Cluster, kernel: str = DEFAULT_KERNEL, head_dim: int = 128,
                dtype: str = "bfloat16") -> tuple[Cluster, str]:
    """`cluster` with its attention rates set to `kernel`'s (measured in the cluster file first,
    then documented for its GPU), and where they came from. A cluster that names no GPU (the
    papers' Ampere testbeds, `local`) keeps its own rate for the kernel it describes."""
    require(kernel in KERNELS, "kernel", kernel, f"must be one of {', '.join(KERNELS)}")
    require(kernel not in NOT_ON.get(cluster.gpu or "", {}), "kernel", kernel,
            f"{NOT_ON.get(cluster.gpu or '', {}).get(kernel)} (cluster {cluster.name})")
    rate = cluster.kernels.get(kernel)
    if rate is None:
        rate = documented(cluster.gpu, kernel, head_dim)
    if rate is None:
        native = cluster.kernel or DEFAULT_KERNEL
        require(kernel == native, "kernel", kernel,
                f"cluster {cluster.name} has rates for {native} only (add measured ones with "
                "`seqpar calibrate` on it, or name its gpu)")
        return cluster, f"{native}: the cluster's own rate ({cluster.source})"
    keys = [d for d in SIXTEEN_BIT if d in cluster.attention_tflops] or [dtype]
    full = {**cluster.attention_tflops, **{d: rate.forward_full for d in keys}}
    backward = {**cluster.attention_backward_tflops, **{d: rate.backward for d in keys}}
    return cluster.model_copy(update={
        "attention_tflops": full, "attention_backward_tflops": backward,
        "causal_rate_ratio": rate.forward_causal / rate.forward_full, "kernel": kernel,
    }), f"{kernel}: {rate.source}"
