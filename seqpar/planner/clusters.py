"""What a cluster is to the performance model: devices, links, NICs (checked records, YAML-loadable).

    c = load("loongtrain-a100")          # a preset (the papers' testbeds, from their text)
    c = load("local")                    # this machine, measured by `seqpar calibrate`
    c = load("my_cluster.yaml")          # any file of the same shape

Throughputs are sustained rates at large blocks. The attention kernel's rate falls at small
blocks: rate(t) = attention_tflops * t / (t + kernel_half_tokens) for a kernel call of t query
tokens. The presets take peak numbers from the vendor datasheets and one documented efficiency
for FlashAttention-2 on Ampere (FLASH_EFFICIENCY, below), the documented kernel and GEMM rates of
Hopper GPUs (`perf.rates`); nothing is fitted to the papers' tables.

Work beside the kernel, per rank: the online-softmax merge of each forward call's partial output,
gradient accumulation and message packing (memory-bound: `merge_gb_per_s`, `copy_gb_per_s`; on a
GPU from its memory bandwidth), and on a host whose ranks talk through the operating system (gloo
over loopback) the transport itself, which runs on the ranks' cores (`transport_gb_per_s`,
`message_us`), plus fixed host costs per ring step, per collective and per attention call
(`step_us`, `collective_us`, `call_us`). The host's issue of every operation (`dispatch_us`:
its dispatch, autograd bookkeeping and a GPU's launch) prices `rules.ops`' counts (`planner.host`).
`seqpar calibrate` measures all of them here. A host
with `cores` runs its ranks on those cores: when ranks outnumber them, the ranks' CPU work is
shared out (`host_seconds`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from seqpar.errors import ConfigError, require
from seqpar.planner.record import Field, Record, record

FILES = Path(__file__).parent / "cluster_files"

# FlashAttention-2 (Dao 2023, Fig. 5-6): causal fwd+bwd, head_dim 128, 16K tokens on an A100 reaches
# ~190 TFLOP/s of the 312 bf16 peak; forward alone is faster, backward slower. One number, ~0.6.
FLASH_EFFICIENCY = 0.6
# the same paper: at 512 tokens the rate is about 2/3 of the 16K rate -> t/(t + 256)
FLASH_HALF_TOKENS = 256
# NCCL reaches ~80% of a link's stated bandwidth on large messages (nccl-tests bus bandwidth)
LINK_EFFICIENCY = 0.8
# memory-bound element-wise kernels reach ~80% of HBM bandwidth (STREAM-like copies on A100/H100)
MEMORY_EFFICIENCY = 0.8
# softmax_merge.merge_into moves its block 5 times: the accumulator scaled in place (read +
# write), then the partial added with one fused multiply-add (two reads, one write); the lse's
# weights are a head_dim-th of that
MERGE_PASSES = 5
# an accumulation (`dq += g`) reads two blocks and writes one
ADD_PASSES = 3


@record
@dataclass(frozen=True, kw_only=True)
class Link(Record):
    bandwidth_gb_per_s: float = Field(gt=0, description="GB/s (1e9 bytes/s) one GPU sends at")
    latency_us: float = Field(5.0, ge=0)

    def seconds(self, nbytes: float, share: int = 1) -> float:
        """A transfer of nbytes while `share` senders share this link."""
        if nbytes <= 0:
            return 0.0
        return self.latency_us * 1e-6 + nbytes * share / (self.bandwidth_gb_per_s * 1e9)


@record
@dataclass(frozen=True, kw_only=True)
class KernelRate(Record):
    """An attention kernel's TFLOP/s at large blocks (16-bit): forward without and with a causal mask,
    and backward (FLOPs counted as seqpar.rules.flops counts them), and where they come from."""

    forward_full: float = Field(gt=0)
    forward_causal: float = Field(gt=0)
    backward: float = Field(gt=0)
    source: str = ""


@record
@dataclass(frozen=True, kw_only=True)
class Cluster(Record):
    name: str
    source: str = Field("", description="where the numbers come from")
    nodes: int = Field(1, gt=0)
    gpus_per_node: int = Field(8, gt=0)
    attention_tflops: dict[str, float] = Field(
        description="sustained attention-kernel TFLOP/s per device at large blocks, by dtype")
    gemm_tflops: dict[str, float] = Field(description="sustained GEMM TFLOP/s per device, by dtype")
    peak_tflops: dict[str, float] = Field(default_factory=dict,
                                          description="datasheet peak per dtype (for MFU)")
    kernel_half_tokens: int = Field(FLASH_HALF_TOKENS, ge=0,
                                    description="query tokens at which the kernel runs at half rate")
    kernel_call_us: float = Field(0.0, ge=0, description="fixed cost of one kernel call (a CPU's "
                                  "dispatch; negligible on GPUs at these sizes)")
    attention_tflops_by_block: dict[str, dict[int, float]] = Field(
        default_factory=dict, description="measured kernel TFLOP/s (fwd+bwd) by mask (causal | full) "
        "and call tokens, in the measured dtype (`seqpar calibrate`); when given it replaces "
        "attention_tflops x t / (t + kernel_half_tokens)")
    attention_time_by_dim: dict[int, float] = Field(
        default_factory=dict, description="measured kernel time (fwd+bwd, same tokens and heads) by "
        "head dim over its time at the dim attention_tflops_by_block was measured at (its entry "
        "1.0; `seqpar calibrate`): on a CPU a score's softmax costs as much as several dims of its "
        "products, so half the dim is more than half the time; none: time in proportion to the dim")
    linear_tflops_by_dim: dict[int, float] = Field(
        default_factory=dict, description="measured TFLOP/s (fwd+bwd, FLOPs as rules.linear counts "
        "them) of a linear layer's chunked delta rule by head dim (`seqpar calibrate`: torch's rule, "
        "a CPU rank's); none: the GEMM rate at a chunk's products (fla's kernels on a GPU)")
    attention_backward_tflops: dict[str, float] = Field(
        default_factory=dict, description="sustained backward TFLOP/s by dtype (default: the "
        "forward's, attention_tflops)")
    causal_rate_ratio: float = Field(1.0, gt=0, description="a causal call's rate over an unmasked "
                                     "one's at large blocks (FlashAttention-3 Fig. 4)")
    gpu: str | None = Field(None, description="the device in seqpar.planner.rates' tables "
                            "(h100, h200, a100): documented kernel and GEMM rates by shape")
    kernel: str | None = Field(None, description="the attention kernel attention_tflops describes "
                               "(None: flash2)")
    kernels: dict[str, KernelRate] = Field(
        default_factory=dict, description="measured attention kernels by name (`seqpar calibrate` "
        "on this cluster): they take precedence over the documented rates")
    memory_gb: float = Field(gt=0, description="device memory, GB (1e9 bytes)")
    host_link_gb_per_s: float | None = Field(None, gt=0, description="one GPU's link to host memory, "
                                             "GB/s each way (offload)")
    host_memory_gb_per_s: float | None = Field(None, gt=0, description="a node's host memory "
                                               "bandwidth, GB/s (an offloaded optimizer step)")
    host_memory_gb: float | None = Field(None, gt=0, description="a node's host memory, GB: what "
                                         "its GPUs offload must fit in it")
    intra: Link = Field(description="one GPU's link to the others of its node")
    nics_per_node: int = Field(1, gt=0)
    inter: Link = Field(description="one NIC: bandwidth and latency between nodes")
    shared_links: bool = Field(True, description="concurrent transfers on one link share it (real "
                               "links); False: each is delayed on its own (link emulation)")
    cores: int | None = Field(None, gt=0, description="a host whose ranks share its cores (local); "
                              "rates are one thread's (a CPU rank runs one thread)")
    memory_gb_per_s: float | None = Field(None, gt=0, description="device memory bandwidth, GB/s "
                                          "(datasheet): the default for merge and copy rates")
    merge_gb_per_s: float | None = Field(None, gt=0, description="bytes of partial output (in the "
                                         "accumulation dtype) merged per second by the online softmax")
    merge_us: float = Field(0.0, ge=0, description="fixed cost of one merge call")
    copy_gb_per_s: float | None = Field(None, gt=0, description="bytes per second written by an "
                                        "accumulation or a packing copy")
    transport_gb_per_s: float | None = Field(None, gt=0, description="bytes per second one rank's "
                                             "cores send (or receive) through a host transport; "
                                             "None: links move data without the ranks' compute")
    message_us: float = Field(0.0, ge=0, description="host time one rank spends per message it "
                              "sends or receives (host transport)")
    step_us: float = Field(0.0, ge=0, description="fixed host time per ring step (posting the "
                           "exchange, planning the calls; a CPU rank's Python and dispatch)")
    collective_us: float = Field(0.0, ge=0, description="fixed host time per collective call "
                                 "(packing loops, posting one message per peer)")
    call_us: float = Field(0.0, ge=0, description="fixed host time per attention call, forward "
                           "and backward (autograd, allocation, the timing barrier)")
    dispatch_us: float = Field(0.0, ge=0, description="host time to issue one operation that "
                               "launches work: PyTorch's dispatch and autograd bookkeeping, on a "
                               "GPU the kernel's launch (`planner.host`; 0: issuing is free)")
    probe_ms: float | None = Field(None, gt=0, description="a CPU host's speed when it was "
                                   "calibrated: one thread's ms for `workers.measure.probe`'s "
                                   "work (the least reading; `--validate` shows a trial's "
                                   "`noise_probe_ms` over it beside the error)")
    waits_us: dict[int, tuple[float, float] | tuple[float, float, float]] = Field(
        default_factory=dict, description="ranks on the host -> (us, us[, us]): what a training "
        "step's message, collective and collective queued behind another (the gradient "
        "reduction's; the collective's when not given) cost a rank beyond their dispatch and what "
        "the links carry, posting them and waiting on the peers on cores the ranks share "
        "(`seqpar calibrate`: the runner's own step, and all-reduces posted back to back; the "
        "entry of the most ranks up to a step's)")
    spread: dict[int, float] = Field(
        default_factory=dict, description="ranks on the host -> how much later than the mean the "
        "last of them finishes equal work run side by side (E[max] / mean - 1; `seqpar "
        "calibrate`): what a stage whose ranks are balanced pays at the collective that ends it "
        "(`planner.contention`; the entry of the most ranks up to a step's)")
    transport_cpu_us: dict[int, tuple[float, float]] = Field(
        default_factory=dict, description="ranks on the host -> (us, us): the CPU a message and a "
        "collective cost on the transport's own threads (gloo's loops), beside the rank's: on "
        "cores its ranks fill, taken from their compute (`planner.contention`)")

    def share(self, world: int) -> float:
        """One rank's fraction of a core when `world` one-thread ranks share the host (1 when
        there are cores enough, cores / P when there are not)."""
        if self.cores is None:
            return 1.0
        return min(1.0, self.cores / world)

    def host_seconds(self, worst: float, total: float, world: int) -> float:
        """Time of a stage whose busiest rank works `worst` seconds and all `world` ranks `total`:
        a device per rank gives `worst`; a host with fewer cores than ranks needs at least
        total / cores as well (its cores are shared out)."""
        if self.cores is None or world <= self.cores:
            return worst
        return max(worst, total / self.cores)

    def _memory_rate(self, passes: int) -> float | None:
        if self.memory_gb_per_s is None:
            return None
        return MEMORY_EFFICIENCY * self.memory_gb_per_s * 1e9 / passes

    def merge_seconds(self, nbytes: float, calls: int = 1) -> float:
        """Merging `calls` partial outputs of nbytes in all into their accumulators."""
        rate = self.merge_gb_per_s * 1e9 if self.merge_gb_per_s else self._memory_rate(MERGE_PASSES)
        return (nbytes / rate if rate else 0.0) + calls * self.merge_us * 1e-6

    def copy_seconds(self, nbytes: float) -> float:
        """Accumulating or packing nbytes."""
        rate = self.copy_gb_per_s * 1e9 if self.copy_gb_per_s else self._memory_rate(ADD_PASSES)
        return nbytes / rate if rate else 0.0

    def transport_seconds(self, nbytes: float, messages: int) -> float:
        """A rank's own time to send or receive `messages` of nbytes in all (host transport)."""
        if self.transport_gb_per_s is None:
            return 0.0
        return nbytes / (self.transport_gb_per_s * 1e9) + messages * self.message_us * 1e-6

    def backward_slowdown(self, dtype: str) -> float:
        """The backward kernel's time per FLOP over the forward's (1 when no backward rate)."""
        back = self.attention_backward_tflops
        if not back:
            return 1.0
        value = back.get(dtype) or back.get("bfloat16") or next(iter(back.values()))
        return self.rate(dtype) / (value * 1e12)

    def rate(self, dtype: str, kind: str = "attention") -> float:
        """FLOP/s of one device for `kind` (attention | gemm) in `dtype` (nearest known dtype)."""
        table = self.attention_tflops if kind == "attention" else self.gemm_tflops
        value = table.get(dtype) or table.get("bfloat16") or next(iter(table.values()))
        return value * 1e12

    def call_rate(self, dtype: str, tokens: float, mask: str) -> float:
        """FLOP/s of one attention kernel call of `tokens` query tokens under `mask`: the measured
        table, interpolated in log(tokens) and held at its ends, or the sustained rate times the
        small-block efficiency t / (t + kernel_half_tokens)."""
        table = self.attention_tflops_by_block.get("full" if mask == "full" else "causal")
        if not table:
            half = self.kernel_half_tokens
            masked = 1.0 if mask == "full" else self.causal_rate_ratio
            return self.rate(dtype) * masked * (tokens / (tokens + half) if half else 1.0)
        points = sorted(table.items())
        if tokens <= points[0][0]:
            return points[0][1] * 1e12
        for (t0, r0), (t1, r1) in zip(points, points[1:], strict=False):
            if tokens <= t1:
                x = math.log(tokens / t0) / math.log(t1 / t0)
                return (r0 + x * (r1 - r0)) * 1e12
        return points[-1][1] * 1e12

    def peak(self, dtype: str) -> float:
        table = self.peak_tflops or self.gemm_tflops
        return (table.get(dtype) or table.get("bfloat16") or next(iter(table.values()))) * 1e12

    def nic_of(self, local_gpu: int, ranks_per_node: int) -> int:
        """The NIC a GPU's inter-node traffic leaves by (GPUs share NICs in blocks)."""
        per_nic = max(1, ranks_per_node // self.nics_per_node)
        return min(local_gpu // per_nic, self.nics_per_node - 1)

    def to_yaml(self) -> str:
        import yaml  # only for a cluster file: a preset needs none (a tenth of a plan's start)

        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


# The host's time to issue one eager PyTorch operation on a server CPU, a GPU's kernel launch
# included: ~1 us of Python, ~1 us of pybind11, 1-3 us of autograd recording, 1-2 us of the ATen
# dispatcher, 1-5 us of the backend's setup and 1-3 us of cudaLaunchKernel, "~5-25 us of CPU-side
# work per op" in all (J. Lin, "From PyTorch op to kernel launch", gpu_kernel_serving lesson 18).
# One number for the forward's Python-issued and the backward's engine-issued operations alike:
# 10 us, towards the low end (the autograd engine issues the backward's without Python).
DISPATCH_US = 10.0

# Maximum Achievable Matmul FLOPS (ml-engineering, compute/accelerator README; bf16, best shape of a
# sweep): A100 SXM 267.9 of 312 TFLOP/s, H100 SXM 792.1 of 989 (perf.rates scales it by shape)
GEMM_EFFICIENCY = {"a100": 267.9 / 312, "h100": 792.1 / 989.4, "h200": 792.1 / 989.4}


# A collective's or a message's latency, one a link class (`planner.net`: every peer posted at
# once). NCCL's own tuning model (NVIDIA/nccl src/graph/tuning.cc, its baseLat and hwLat tables):
# a ring collective costs a base 3.6 us (LL protocol, small messages; Simple 8.4) plus, a hop,
# 0.47 us over NVLink (Simple 3.4) and 2.7 us over the network (Simple 9.6). 8 GPUs over NVLink:
# 3.6 + 7 x 0.47 = 6.9 us (LL); one network hop adds 2.7-9.6. Presets: 5 us within a node, 10
# across InfiniBand; 30 across the Ethernet of the cloud presets (an assumption: no table of NCCL
# gives TCP's).
INTRA_LATENCY_US, INTER_LATENCY_US = 5.0, 10.0


def _nvidia(name: str, source: str, nodes: int, gpn: int, mem: float, nvlink: float, nics: int,
            nic_gbit: float, peak_bf16: float = 312.0, inter_latency: float = INTER_LATENCY_US,
            hbm: float = 2039.0, gpu: str = "a100", host_link: float | None = None,
            host_memory: float | None = None, host_gb: float | None = None) -> Cluster:
    """A preset from datasheet numbers: the attention kernel at FlashAttention-2's documented
    efficiency (Ampere; a Hopper's documented kernels replace it, perf.rates), GEMMs at the
    documented maximum achievable rate, links at NCCL's efficiency."""
    gemm = GEMM_EFFICIENCY[gpu] * peak_bf16
    return Cluster(
        name=name, source=source, nodes=nodes, gpus_per_node=gpn, memory_gb_per_s=hbm, gpu=gpu,
        attention_tflops={"bfloat16": FLASH_EFFICIENCY * peak_bf16,
                          "float16": FLASH_EFFICIENCY * peak_bf16,
                          "float32": FLASH_EFFICIENCY * peak_bf16 / 16},
        gemm_tflops={"bfloat16": gemm, "float16": gemm, "float32": gemm / 16},
        peak_tflops={"bfloat16": peak_bf16, "float16": peak_bf16, "float32": peak_bf16 / 16},
        memory_gb=mem, dispatch_us=DISPATCH_US,
        intra=Link(bandwidth_gb_per_s=LINK_EFFICIENCY * nvlink, latency_us=INTRA_LATENCY_US),
        nics_per_node=nics, host_link_gb_per_s=host_link, host_memory_gb_per_s=host_memory,
        host_memory_gb=host_gb,
        inter=Link(bandwidth_gb_per_s=LINK_EFFICIENCY * nic_gbit / 8, latency_us=inter_latency))


# NVLink figures are per direction per GPU (A100/A800 NVLink3: 600 GB/s both ways = 300 each way;
# BurstEngine states 400 GB/s for its A800 nodes, i.e. 200 each way); H100/H200 NVLink4 450 each way.
# HBM bandwidth (datasheets): A100/A800 80 GB SXM 2039 GB/s, A100 40 GB 1555, H100 SXM 3350,
# H200 SXM 4800. Memory: the papers' presets count their "80 GB" as 80e9 bytes; the H100 and H200
# presets count nvidia-smi's GiB (80 GiB = 85.9e9, 141 GB -> 140 GiB = 150.3e9).
# Host side (DGX H100/H200 datasheets): PCIe Gen5 x16 per GPU, 64 GB/s each way (x 0.8, NCCL-like
# efficiency: 51); two Xeon 8480C with 8 DDR5-4800 channels each, 2 x 307 GB/s per node; 2 TB.
H100 = dict(peak_bf16=989.4, hbm=3350.0, gpu="h100", host_link=51.2, host_memory=614.4,
            host_gb=2048.0)
CLUSTERS: dict[str, Cluster] = {
    "loongtrain-a100": _nvidia(
        "loongtrain-a100", "LoongTrain §5 testbed: 8 nodes x 8 Ampere 80 GB, NVLink, "
        "4 x HDR 200 Gb/s NICs per node, no SHARP", 8, 8, 80, 300, 4, 200),
    "burst-a800": _nvidia(
        "burst-a800", "BurstEngine §4.1: A800-SXM4-80GB nodes, 400 GB/s NVLink, "
        "8 x HDR 200 Gb/s NICs per node", 8, 8, 80, 200, 8, 200),
    "wallfacer-h100": _nvidia(
        "wallfacer-h100", "WallFacer §5: 8 nodes x 8 H100 80 GB, NVLink, InfiniBand with 8 "
        "ConnectX-7 (400 Gb/s) per node", 8, 8, 80, 450, 8, 400, **H100),
    "wallfacer-a100-16": _nvidia(
        "wallfacer-a100-16", "WallFacer §5: Google Cloud, 2 machines x 16 A100 40 GB, NVLink, "
        "Ethernet between (100 Gb/s assumed: the paper gives no rate)", 2, 16, 40, 300, 1, 100,
        inter_latency=30.0, hbm=1555.0),
    "wallfacer-a100-8": _nvidia(
        "wallfacer-a100-8", "WallFacer §5: Google Cloud, 4 machines x 8 A100 40 GB, NVLink, "
        "Ethernet between (100 Gb/s assumed: the paper gives no rate)", 4, 8, 40, 300, 1, 100,
        inter_latency=30.0, hbm=1555.0),
    "h100-sxm": _nvidia(
        "h100-sxm", "DGX H100 datasheet: 8 x H100 SXM5 80 GB a node (989 TFLOP/s bf16 dense, HBM3 "
        "3.35 TB/s), NVLink 4 (900 GB/s both ways), 8 x ConnectX-7 400 Gb/s InfiniBand", 1, 8,
        85.9, 450, 8, 400, **H100),
    "h200-sxm": _nvidia(
        "h200-sxm", "DGX H200 datasheet: 8 x H200 SXM 141 GB a node (989 TFLOP/s bf16 dense, HBM3e "
        "4.8 TB/s), NVLink 4 (900 GB/s both ways), 8 x ConnectX-7 400 Gb/s InfiniBand", 1, 8,
        150.3, 450, 8, 400, **{**H100, "hbm": 4800.0, "gpu": "h200"}),
    "torchtitan-h100": _nvidia(
        "torchtitan-h100", "torchtitan docs/performance.md (Grand Teton): 8 x H100 96 GB HBM2e "
        "(2.4 TB/s) a node, NVLink, 400 Gb/s RDMA per GPU, 500 W power limit (not modelled: the "
        "SXM's 989 TFLOP/s assumed)", 1, 8, 103.1, 450, 8, 400, **{**H100, "hbm": 2400.0}),
}


def names() -> list[str]:
    return [*CLUSTERS, *sorted(p.stem for p in FILES.glob("*.yaml") if p.stem not in CLUSTERS)]


def load(name_or_path: str) -> Cluster:
    """A preset name, a file in cluster_files/ (`local`), or a YAML path."""
    if name_or_path in CLUSTERS:
        return CLUSTERS[name_or_path]
    path = Path(name_or_path)
    if not path.suffix:
        path = FILES / f"{name_or_path}.yaml"
    require(path.is_file(), "cluster", name_or_path,
            f"must be one of {', '.join(names())} or a YAML file")
    import pydantic  # only for a cluster file: its checks and its words (`record`)
    import yaml  # only for a cluster file (`Cluster.to_yaml`)

    try:
        return Cluster.model_validate(yaml.safe_load(path.read_text()))
    except pydantic.ValidationError as err:
        first = err.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"cluster {path.name}: {where}", first.get("input"), first["msg"]) from None


def twin(cluster: Cluster, local: Cluster, dtype: str = "float32") -> Cluster:
    """`local` with `cluster`'s links slowed by local / cluster kernel throughput (bandwidth times
    the ratio, latency over it): a run here then has the cluster's compute/communication balance
    per rank. One rank per NIC: the emulation delays each transfer on its own, so each GPU gets
    its fair share of its node's NICs."""
    ratio = local.rate(dtype) / cluster.rate("bfloat16")
    per_gpu = cluster.inter.bandwidth_gb_per_s * cluster.nics_per_node / cluster.gpus_per_node

    def scaled(bw: float, lat: float) -> Link:
        return Link(bandwidth_gb_per_s=bw * ratio, latency_us=lat / ratio)

    return local.model_copy(update={
        "name": f"{cluster.name}@{local.name}", "source": f"{cluster.name} scaled to {local.name}",
        "intra": scaled(cluster.intra.bandwidth_gb_per_s, cluster.intra.latency_us),
        "inter": scaled(per_gpu, cluster.inter.latency_us),
        "nics_per_node": local.gpus_per_node, "shared_links": False})


def save(cluster: Cluster, path: str | Path | None = None) -> Path:
    path = Path(path) if path is not None else FILES / f"{cluster.name}.yaml"
    path.write_text(cluster.to_yaml())
    return path
