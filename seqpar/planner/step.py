"""The whole training step of one configuration: DP x SP ranks, one attention algorithm, one
training policy, `micro_batches` micro-steps of `batch` sequences per DP rank, then the optimizer.

Per block and micro-step, on one rank of s = N / SP tokens:
- GEMMs (q, k, v, o, SwiGLU: 2·tokens·params forward, backward 2x) at the cluster's GEMM rate for
  their shape (`rates.gemm_rate`); element-wise work (norms, RoPE, SwiGLU's gate, residuals: ~10d +
  2(d + kv) + 3·ffn elements a token forward, twice that backward) at HBM bandwidth;
- the attention's forward + backward exactly as the attention scope predicts it (`api.predict`:
  kernel, SP communication and its overlap with the attention's own compute, on the SP group's
  links), at the rates of the kernel that will run (`rates.with_kernel`): one model of a ring,
  within a node or across nodes, for both scopes;
- the recompute of the checkpoint mode: full re-runs the block's forward (the attention's forward
  as predicted, its communication included), sc++ the GEMMs and element-wise work, seq:F a
  fraction F of them, seq-attn:F the block's GEMMs and element-wise work and the attention's
  forward over the prefix of F·N tokens (its own prediction: its ring carries the prefix's K,V); a
  tiled MLP recomputes the MLP of whatever is not recomputed already;
- FSDP over the sharding group (`states`, `fsdp.py`): the block's parameters all-gathered twice
  (forward, and again for backward: reshard after forward) in the compute dtype and its gradients
  reduce-scattered in the master dtype, prefetched and overlapped with the block. They share the
  links with the attention: a block lasts max(its compute path, each link class's busy time), the
  compute path being the work above with the attention's own exposed communication, a link's busy
  time FSDP's plus the attention's (`Prediction.link_ms`: its busiest link of the class), and the
  host link's time of offloaded parameters and activations. The first gather and last
  reduce-scatter of a micro-step are exposed, as are the root's (embedding, head, norm).
Once per step: the data-parallel reduction of what FSDP did not reduce (an all-reduce over DP for
`sp` states, over all ranks for replicated and zero1 ones) in the last micro-step's blocks, and AdamW
(memory-bound: 7 state reads and writes per parameter at HBM bandwidth, or at the host's memory
bandwidth when the optimizer is offloaded, its gradients and parameters crossing the host link);
under zero1 AdamW over the most-loaded rank's share (`rules.memory.zero1_partition`), then the
updated parameters' broadcast from their owners (an all-gather's bytes, exposed).

The LM head and loss: 3 x 2·tokens·d·V at the GEMM rate plus the logits' element-wise passes.
TGS = tokens per step / (step time x ranks); `mfu`, `mfu_unmasked_attention` and `hfu` as
`rules.flops` defines them (the attention by its area under the step's mask; hfu with the kernels'
2.5x backward and the recompute).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from typing import Any

from seqpar.planner import host, memory
from seqpar.planner.api import Prediction, predict
from seqpar.planner.clusters import MEMORY_EFFICIENCY, Cluster
from seqpar.planner.fsdp import traffic
from seqpar.planner.net import Net
from seqpar.planner.policy import Policy
from seqpar.planner.rates import gemm_rate
from seqpar.rules import masks
from seqpar.rules.flops import causal_pairs, conventions, head_flops, recomputed_flops
from seqpar.rules.memory import (
    ELEM,
    TrainPolicy,
    block_bytes,
    predicted_states,
    prefix_layout,
    zero1_partition,
)
from seqpar.rules.model import ModelConfig, block_numel, block_shapes
from seqpar.rules.shape import DTYPE_BYTES, AttnShape

# where a step's time goes: the attention's kernels, its own exposed communication (as the
# attention scope predicts it), the rest of the compute, the recompute, the exposed communication
# besides the attention's (FSDP, DP reductions, links shared past the compute), the optimizer
# (the host's issue time that the device's does not hide: `host`)
PARTS = ("attention", "attention_comm", "other_compute", "recompute", "exposed_comm", "optimizer",
         "host")
LINKS = ("intra", "inter")
BACKWARD_SHARE = 2 / 3  # of a micro-batch's time: two of its three passes (the matmuls' rule)
ADAM_PASSES = 7  # AdamW reads parameter, gradient, two moments; writes parameter, two moments


def shape_of(cfg: ModelConfig, seq_len: int, batch: int = 1, elem_bytes: int = 2) -> AttnShape:
    return AttnShape(batch, seq_len, cfg.heads, cfg.kv_heads, cfg.head_dim, elem_bytes)


@dataclass(frozen=True)
class Setup:
    """What one search holds fixed: the cluster (with the kernel's rates), the model, the step."""

    cluster: Cluster
    cfg: ModelConfig
    seq_len: int
    tokens_per_step: int | None  # all ranks together (None: one sequence per DP replica a step)
    world: int              # all ranks: DP x SP
    nodes: int
    dtype: str = "bfloat16"
    batch: int = 1          # sequences per micro-step of a DP rank
    kernel: str = "flash2"
    kernel_source: str = ""
    causal: bool = True
    mask: masks.Mask | None = None  # any mask of seq_len tokens (None: plain causal / full)
    cache: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    @cached_property
    def net(self) -> Net:
        return Net(self.cluster, self.world, self.nodes)

    @cached_property
    def shape(self) -> AttnShape:
        return shape_of(self.cfg, self.seq_len, self.batch, DTYPE_BYTES[self.dtype])

    @property
    def per_node(self) -> int:
        return max(1, self.world // self.nodes)

    def step_tokens(self, dp: int) -> int:
        """Tokens a step of a DP x SP split trains on, all ranks together."""
        return self.tokens_per_step or self.seq_len * self.batch * dp

    def micro_batches(self, dp: int) -> int:
        """Micro-steps per step of each DP rank (0 when the tokens do not split evenly)."""
        per_rank = self.seq_len * self.batch * dp
        tokens = self.step_tokens(dp)
        return tokens // per_rank if tokens % per_rank == 0 else 0

    def sp_nodes(self, sp: int) -> int:
        return max(1, sp // self.per_node)

    def attention(self, sp: int, name: str, options: dict[str, Any], layout: str) -> Prediction:
        """One layer's attention (forward + backward) over an SP group of sp ranks."""
        return predict(host.bare(self.cluster), name, self.shape, sp, nodes=self.sp_nodes(sp),
                       options=options,
                       layout=layout, causal=self.causal, dtype=self.dtype, mask=self.mask)

    def prefix(self, sp: int, attn: Prediction, fraction: float) -> Prediction:
        """The forward seq-attn re-runs in backward: the attention over the first fraction x N
        tokens (every rank's first fraction of its shard), in the layout that deals that prefix
        (`rules.memory.prefix_layout`), as causal attention (memoised)."""
        key = ("prefix", sp, attn.algorithm, tuple(sorted(attn.options.items())), attn.layout,
               fraction)
        got = self.cache.get(key)
        if got is None:
            rows = max(1, round(fraction * self.shape.shard_len(sp)))  # the runner's rows a rank
            shape = replace(self.shape, seq_len=rows * sp)
            got = self.cache[key] = predict(
                host.bare(self.cluster), attn.algorithm, shape, sp, nodes=self.sp_nodes(sp),
                options=attn.options, layout=prefix_layout(attn.layout, sp, fraction), causal=True,
                dtype=self.dtype, mode="fwd")
        return got

    @property
    def pairs(self) -> float:
        """Visible (query, key) pairs of one sequence: the mask's area, N²/2 causal, N² full."""
        if self.mask is not None:
            return float(self.mask.area)
        return causal_pairs(self.seq_len) if self.causal else float(self.seq_len) ** 2


@dataclass
class Step:
    """One configuration's predicted step."""

    dp: int
    sp: int
    attention: Prediction
    policy: Policy
    micro_batches: int
    kernel: str
    step_ms: float
    tgs: float
    mfu: float                      # model FLOPs by area (rules.flops: Megatron-LM's, causal halved)
    mfu_unmasked_attention: float   # torchtitan's: the attention counted as if unmasked
    hfu: float                      # the kernels' FLOPs: 2.5x attention backward, the recompute
    peak_mem_bytes: int
    fits: bool
    parts: dict[str, float] = field(default_factory=dict)     # ms per step, summing to step_ms
    memory: dict[str, int] = field(default_factory=dict)
    # (a search's --top 0) the attention configuration that beats this one on everything a step
    # depends on, whose best policy this one is timed under; None: not dominated
    dominated_by: dict[str, Any] | None = None
    host_bound: bool = False        # the host's issuing sets the step's pace (`planner.host`)

    @property
    def algorithm(self) -> str:
        return self.attention.algorithm

    @property
    def options(self) -> dict[str, Any]:
        return self.attention.options

    @property
    def layout(self) -> str:
        return self.attention.layout

    @property
    def attention_ms(self) -> float:
        return self.attention.attention_ms

    def json(self) -> dict[str, Any]:
        return {"dp": self.dp, "sp": self.sp, "algorithm": self.algorithm, "options": self.options,
                "layout": self.layout, **self.policy.fields(), "kernel": self.kernel,
                "micro_batches": self.micro_batches,
                "predicted": {"step_ms": round(self.step_ms, 3), "tgs": round(self.tgs, 2),
                              "mfu": round(self.mfu, 4),
                              "mfu_unmasked_attention": round(self.mfu_unmasked_attention, 4),
                              "hfu": round(self.hfu, 4),
                              "attention_layer_ms": round(self.attention_ms, 3),
                              "peak_mem_bytes": self.peak_mem_bytes,
                              "parts_ms": {k: round(v, 3) for k, v in self.parts.items()},
                              "host_bound": self.host_bound, "memory": self.memory},
                "fits": self.fits, "dominated_by": self.dominated_by}


def _stream_seconds(c: Cluster, nbytes: float) -> float:
    """Seconds to stream nbytes through device memory (a memory-bound kernel)."""
    if c.memory_gb_per_s:
        return nbytes / (MEMORY_EFFICIENCY * c.memory_gb_per_s * 1e9)
    if c.copy_gb_per_s:  # a measured host: copy_gb_per_s counts bytes written, 3 moved per write
        return nbytes / (3 * c.copy_gb_per_s * 1e9)
    return 0.0


def block_gemm_seconds(c: Cluster, cfg: ModelConfig, tokens: float, dtype: str,
                       only: tuple[str, ...] | None = None) -> float:
    """Forward seconds of a block's GEMMs (or of the named weights) for `tokens` tokens."""
    total = 0.0
    for name, shape in block_shapes(cfg).items():
        if len(shape) == 2 and (only is None or name in only):
            total += 2.0 * tokens * shape[0] * shape[1] / gemm_rate(c, dtype, min(tokens, *shape))
    return total


def elementwise_bytes(cfg: ModelConfig, tokens: float, e: int) -> float:
    """Bytes a block's element-wise kernels move forward (norms, RoPE, SwiGLU's gate, residuals)."""
    kv = cfg.kv_heads * cfg.head_dim
    return tokens * (10 * cfg.hidden + 2 * (cfg.hidden + kv) + 3 * cfg.ffn) * e


def step(setup: Setup, dp: int, sp: int, attn: Prediction, policy: Policy,
         train: TrainPolicy | None = None) -> Step:
    """The step of one configuration (`train`: the runner's exact policy, default policy's)."""
    c, cfg, dtype = setup.cluster, setup.cfg, setup.dtype
    train = train or policy.train(dtype)
    stored = ELEM[train.master_dtype or dtype]
    world, layers = dp * sp, cfg.layers
    g, mlp, ew, hd = _layer(setup, sp)
    a_all, a_kernel = attn.attention_ms / 1e3, attn.compute_ms / 1e3
    mode, frac = train.checkpoint, train.seq_fraction
    # the attention's forward that backward runs again: the whole (full), the prefix (seq-attn)
    again = {"full": attn, "seq-attn": setup.prefix(sp, attn, frac)
             if mode == "seq-attn" and frac > 0 else None}.get(mode)
    share = {"none": 0.0, "full": 1.0, "sc++": 1.0, "seq-attn": 1.0}.get(mode, frac)
    recompute = share * (g + ew) + (again.forward_ms / 1e3 if again is not None else 0.0)
    if train.tiled:
        recompute += (1.0 - share) * mlp
    compute = 3 * (g + ew) + a_all + recompute
    key = ("comm", dp, sp, policy.states, train.master_dtype)
    if key not in setup.cache:
        setup.cache[key] = traffic(setup.net, cfg, dtype, dp, sp, policy, train)
    comm = setup.cache[key]
    busy = {k: (attn.link_ms[k] + (again.forward_link_ms[k] if again is not None else 0.0)) / 1e3
            for k in LINKS}
    offload = 0.0
    if train.offload and c.host_link_gb_per_s:
        shard = block_numel(cfg) / policy.shards(dp, sp, setup.per_node)
        moved = 3 * stored * shard if "params" in train.offload else 0.0
        if "activations" in train.offload:
            moved += 2 * block_bytes(cfg, setup.shape.batch, setup.shape.shard_len(sp), dtype,
                                     train, memory.attention_held(attn.algorithm, setup.shape, sp,
                                                                  attn.options))
        offload = moved / (c.host_link_gb_per_s * 1e9)
    block = max(compute, offload, *(comm.busy(k) + busy[k] for k in LINKS))
    last = max(compute, offload, *(comm.busy(k, last=True) + busy[k] for k in LINKS))
    edges = comm.gather.seconds + comm.scatter.seconds + comm.root
    micro = layers * block + hd + edges
    micro_last = layers * last + hd + edges + comm.reduce_root
    m = setup.micro_batches(dp)
    optimizer = _optimizer_seconds(setup, cfg, policy, train, dp, sp)
    device = (m - 1) * micro + micro_last + optimizer + comm.update.seconds
    issue_micro, issue_step, queued = _host_issue(setup, attn, train, dp, sp)
    last_stretch = host.stretch(c, micro_last, issue_micro)
    # GradSync posts each gradient's all-reduce as backward writes it: their waits run beside
    # the last backward, what is left is exposed
    hidden = min(queued, BACKWARD_SHARE * last_stretch)
    seconds = ((m - 1) * host.stretch(c, micro, issue_micro) + last_stretch
               + host.stretch(c, optimizer + comm.update.seconds, issue_step) - hidden)

    parts = {"attention": m * layers * a_kernel, "attention_comm": m * layers * (a_all - a_kernel),
             "other_compute": m * (layers * 3 * (g + ew) + hd),
             "recompute": m * layers * recompute, "optimizer": optimizer,
             "host": seconds - device}
    parts["exposed_comm"] = max(0.0, seconds - sum(parts.values()))
    tps = setup.step_tokens(dp)
    recomputed = recomputed_flops(cfg, setup.batch, setup.seq_len, sp, mode, frac,
                                  setup.pairs) * world * m
    flops = conventions(cfg, tps // setup.seq_len, setup.seq_len, setup.pairs, recomputed)
    peak = c.peak(dtype) * world * seconds
    shards = policy.shards(dp, sp, setup.per_node)
    mem = memory.step_memory(attn.algorithm, setup.shape, sp, attn.options, cfg, train,
                             attn.peak_mem_bytes, dtype, dp=dp, shards=shards,
                             comms=memory.communicators(attn.algorithm, sp, dp, policy.states,
                                                        setup.per_node)
                             if c.cores is None else 0)
    mem["host"] = _host_bytes(setup, cfg, train, policy, attn, dp, sp)
    fits = mem["peak"] <= c.memory_gb * 1e9 and (
        c.host_memory_gb is None or mem["host"] * setup.per_node <= c.host_memory_gb * 1e9)
    return Step(dp, sp, attn, policy, m, setup.kernel, 1e3 * seconds, tps / (seconds * world),
                flops["mfu"] / peak, flops["mfu_unmasked_attention"] / peak, flops["hfu"] / peak,
                mem["peak"], fits, {k: 1e3 * parts[k] for k in PARTS}, mem,
                host_bound=host.bound(c, device, m * issue_micro + issue_step))


def _host_issue(setup: Setup, attn: Prediction, train: TrainPolicy, dp: int, sp: int
                ) -> tuple[float, float, float]:
    """(a micro-batch's, the step's own) host issue seconds on one rank (`planner.host`), a CPU
    host's cores shared out among its ranks, and the waits of the step's own that a backward
    hides (`host.queued_seconds`; memoised per configuration)."""
    c, world = setup.cluster, dp * sp
    key = ("host", sp, attn.algorithm, tuple(sorted(attn.options.items())), attn.layout,
           train.checkpoint, train.fused_head, world)
    micro = setup.cache.get(key)
    if micro is None:
        mask = "causal" if setup.causal or setup.mask is not None else "full"
        micro = setup.cache[key] = host.on_host(c, host.micro_seconds(
            c, setup.cfg, algorithm=attn.algorithm, d=sp, layout=attn.layout,
            options=attn.options, checkpoint=train.checkpoint, kernel=setup.kernel, mask=mask,
            fused_head=train.fused_head, world=world), world)
    key = ("host once", train.states, world)
    once = setup.cache.get(key)
    if once is None:
        once = setup.cache[key] = (
            host.on_host(c, host.step_seconds(c, setup.cfg, states=train.states, world=world,
                                              kernel=setup.kernel), world),
            host.queued_seconds(c, setup.cfg, states=train.states, world=world))
    return micro, *once


def _layer(setup: Setup, sp: int) -> tuple[float, float, float, float]:
    """`layer_seconds` for one rank of an SP group of sp (memoised per sp)."""
    key = ("layer", sp)
    got = setup.cache.get(key)
    if got is None:
        tokens = setup.shape.batch * setup.shape.shard_len(sp)
        got = setup.cache[key] = layer_seconds(setup.cluster, setup.cfg, setup.dtype, tokens,
                                               setup.world)
    return got


def layer_seconds(c: Cluster, cfg: ModelConfig, dtype: str, tokens: float,
                  world: int = 1) -> tuple[float, float, float, float]:
    """(a block's GEMMs, its MLP's GEMMs, its element-wise work, the head and loss), forward
    seconds of `tokens` tokens on one of `world` ranks (CPU ranks share a host's cores)."""

    def host(seconds: float) -> float:
        return c.host_seconds(seconds, seconds * world, world)

    return (host(block_gemm_seconds(c, cfg, tokens, dtype)),
            host(block_gemm_seconds(c, cfg, tokens, dtype, ("w1", "w2", "w3"))),
            host(_stream_seconds(c, elementwise_bytes(cfg, tokens, ELEM[dtype]))),
            host(3 * head_flops(cfg, tokens) / gemm_rate(c, dtype, min(tokens, cfg.hidden))
                 + _stream_seconds(c, 4 * tokens * cfg.vocab * 4)))  # logits: fp32 passes


def _host_bytes(setup: Setup, cfg: ModelConfig, train: TrainPolicy, policy: Policy,
                attn: Prediction, dp: int, sp: int) -> int:
    """Bytes one rank keeps in host memory: offloaded states and activations."""
    if not train.offload:
        return 0
    host = predicted_states(cfg, setup.dtype, train, policy.shards(dp, sp, setup.per_node))["host"]
    if "activations" in train.offload:
        held = memory.attention_held(attn.algorithm, setup.shape, sp, attn.options)
        host += max(0, cfg.layers - 2) * block_bytes(cfg, setup.shape.batch,
                                                     setup.shape.shard_len(sp), setup.dtype,
                                                     train, held)
    return int(host)


def _optimizer_seconds(setup: Setup, cfg: ModelConfig, policy: Policy, train: TrainPolicy,
                       dp: int, sp: int) -> float:
    c = setup.cluster
    stored = ELEM[train.master_dtype or setup.dtype]
    shards = policy.shards(dp, sp, setup.per_node)
    # zero1: the rank with the largest share of whole parameters steps last
    numel = max(zero1_partition(cfg, shards)) if train.states == "zero1" else params(cfg) / shards
    nbytes = ADAM_PASSES * stored * numel
    if "optimizer" in train.offload and c.host_memory_gb_per_s and c.host_link_gb_per_s:
        crossing = 0.0 if "params" in train.offload else 2 * stored * numel  # grads out, params in
        cpu = nbytes / (c.host_memory_gb_per_s * 1e9 / setup.per_node)
        return cpu + crossing / (c.host_link_gb_per_s * 1e9)
    return c.host_seconds(_stream_seconds(c, nbytes), _stream_seconds(c, nbytes) * dp * sp, dp * sp)


@lru_cache(maxsize=64)
def params(cfg: ModelConfig) -> int:
    return cfg.params()
