"""The whole training step of one configuration: DP x SP ranks, one attention algorithm, one
training policy, `micro_batches` micro-steps of `batch` sequences per DP rank, then the optimizer.

Per block and micro-step, on one rank of s = N / SP tokens:
- GEMMs (q, k, v, o, SwiGLU: 2·tokens·params forward, backward 2x) at the cluster's GEMM rate for
  their shape (`rates.gemm_rate`); element-wise work (norms, RoPE, SwiGLU's gate, residuals: ~10d +
  2(d + kv) + 3·ffn elements a token forward, twice that backward) at HBM bandwidth;
- the attention's forward + backward from its schedule (`api.predict`: kernel, SP communication
  and its overlap), at the rates of the kernel that will run (`rates.with_kernel`);
- the recompute of the checkpoint mode: full re-runs the block's forward (attention and its
  communication included), sc++ the GEMMs and element-wise work, seq:F a fraction F of them; a
  tiled MLP recomputes the MLP of whatever is not recomputed already;
- FSDP over the sharding group (`states`): the block's parameters all-gathered twice (forward, and
  again for backward: reshard after forward) in the compute dtype and its gradients
  reduce-scattered in the master dtype, prefetched and overlapped with the neighbouring blocks'
  compute: a block lasts max(compute, link time of FSDP + the attention's own bytes, host-link
  time of offloaded parameters and activations). The first gather and last reduce-scatter of a
  micro-step are exposed, as are the root's (embedding, head, norm).
Once per step: the data-parallel reduction of what FSDP did not reduce (an all-reduce over DP for
`sp` states, over all ranks for replicated ones) in the last micro-step's backward, and AdamW
(memory-bound: 7 state reads and writes per parameter at HBM bandwidth, or at the host's memory
bandwidth when the optimizer is offloaded, its gradients and parameters crossing the host link).

The LM head and loss: 3 x 2·tokens·d·V at the GEMM rate plus the logits' element-wise passes.
TGS = tokens per step / (step time x ranks); MFU = model FLOPs (rules.flops.step_flops, no
recompute) / (step time x ranks x peak), attention counted unmasked (`mfu`) and causal-halved.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from typing import Any

from seqpar.experiments.clusters import MEMORY_EFFICIENCY, Cluster
from seqpar.experiments.perf import memory
from seqpar.experiments.perf.api import Prediction, predict, predict_spec
from seqpar.experiments.perf.net import Net
from seqpar.experiments.perf.policy import Policy
from seqpar.experiments.perf.rates import gemm_rate
from seqpar.rules import masks
from seqpar.rules.flops import head_flops, step_flops
from seqpar.rules.memory import ELEM, TrainPolicy, block_bytes, predicted_states
from seqpar.rules.model import ModelConfig, block_numel, block_shapes
from seqpar.rules.shape import DTYPE_BYTES, AttnShape

PARTS = ("attention", "other_compute", "recompute", "exposed_comm", "optimizer")
ADAM_PASSES = 7  # AdamW reads parameter, gradient, two moments; writes parameter, two moments


def shape_of(cfg: ModelConfig, seq_len: int, batch: int = 1, elem_bytes: int = 2) -> AttnShape:
    return AttnShape(batch, seq_len, cfg.heads, cfg.kv_heads, cfg.head_dim, elem_bytes)


@dataclass(frozen=True)
class Setup:
    """What one search holds fixed: the cluster (with the kernel's rates), the model, the step."""

    cluster: Cluster
    cfg: ModelConfig
    seq_len: int
    tokens_per_step: int
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

    def micro_batches(self, dp: int) -> int:
        """Micro-steps per step of each DP rank (0 when the tokens do not split evenly)."""
        per_rank = self.seq_len * self.batch * dp
        return self.tokens_per_step // per_rank if self.tokens_per_step % per_rank == 0 else 0

    def sp_nodes(self, sp: int) -> int:
        return max(1, sp // self.per_node)

    def attention(self, sp: int, name: str, options: dict[str, Any], layout: str) -> Prediction:
        """One layer's attention (forward + backward) over an SP group of sp ranks."""
        return predict(self.cluster, name, self.shape, sp, nodes=self.sp_nodes(sp), options=options,
                       layout=layout, causal=self.causal, dtype=self.dtype, mask=self.mask)


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
    mfu: float
    mfu_causal_halved: float
    peak_mem_bytes: int
    fits: bool
    parts: dict[str, float] = field(default_factory=dict)     # ms per step, summing to step_ms
    memory: dict[str, int] = field(default_factory=dict)

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
                              "mfu_causal_halved": round(self.mfu_causal_halved, 4),
                              "peak_mem_bytes": self.peak_mem_bytes,
                              "parts_ms": {k: round(v, 3) for k, v in self.parts.items()},
                              "memory": self.memory},
                "fits": self.fits}


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


@dataclass(frozen=True)
class _Comm:
    gather: float        # one block's all-gather
    scatter: float       # one block's reduce-scatter
    root: float          # the root's gather + reduce-scatter, once a micro-step
    reduce: float        # one block's data-parallel all-reduce (last micro-step)
    reduce_root: float


def _groups(setup: Setup, dp: int, sp: int, over: str) -> list[list[int]]:
    """Rank r = dp index x sp + sp index: `all`, the `sp` groups, the `dp` groups, each `node`'s
    ranks, or the ranks of one local index across `nodes`."""
    world, per = dp * sp, min(setup.per_node, dp * sp)
    if over == "all":
        return [list(range(world))]
    if over == "sp":
        return [[d * sp + i for i in range(sp)] for d in range(dp)]
    if over == "node":
        return [list(range(n, n + per)) for n in range(0, world, per)]
    if over == "nodes":
        return [list(range(j, world, per)) for j in range(per)]
    return [[d * sp + i for d in range(dp)] for i in range(sp)]


def _comm(setup: Setup, dp: int, sp: int, policy: Policy, train: TrainPolicy) -> _Comm:
    cfg, net = setup.cfg, setup.net
    e, stored = ELEM[setup.dtype], ELEM[train.master_dtype or setup.dtype]
    block, root = block_numel(cfg), 2 * cfg.vocab * cfg.hidden + cfg.hidden
    shards = policy.shards(dp, sp, setup.per_node)

    def coll(over: str, size: int, numel: int, elem: int, factor: float) -> float:
        if size < 2:
            return 0.0
        nbytes = int(factor * (size - 1) / size * numel * elem)
        return net.collective(_groups(setup, dp, sp, over), nbytes).seconds

    over = {"dp_sp": "all", "sp": "sp", "node": "node"}.get(policy.states, "all")
    gather = coll(over, shards, block, e, 1) if policy.states != "replicated" else 0.0
    scatter = coll(over, shards, block, stored, 1) if policy.states != "replicated" else 0.0
    root_s = coll(over, shards, root, e, 1) + coll(over, shards, root, stored, 1) \
        if policy.states != "replicated" else 0.0
    if policy.states == "replicated":
        reduce = coll("all", dp * sp, block, stored, 2)
        reduce_root = coll("all", dp * sp, root, stored, 2)
    elif policy.states == "sp":
        reduce = coll("dp", dp, block // sp, stored, 2)
        reduce_root = coll("dp", dp, root // sp, stored, 2)
    elif policy.states == "node":
        nodes = dp * sp // shards
        reduce = coll("nodes", nodes, block // shards, stored, 2)
        reduce_root = coll("nodes", nodes, root // shards, stored, 2)
    else:
        reduce = reduce_root = 0.0
    return _Comm(gather, scatter, root_s, reduce, reduce_root)


def _attention_link(c: Cluster, p: Prediction, per_node: int, forward_only: bool = False) -> float:
    """Seconds the attention's own bytes keep one rank's links busy."""
    intra, inter = p.forward_bytes if forward_only else (p.bytes_intra, p.bytes_inter)
    share = max(1, per_node // c.nics_per_node)
    return c.intra.seconds(intra) + c.inter.seconds(inter, share)


def step(setup: Setup, dp: int, sp: int, attn: Prediction, policy: Policy,
         train: TrainPolicy | None = None) -> Step:
    """The step of one configuration (`train`: the runner's exact policy, default policy's)."""
    c, cfg, dtype = setup.cluster, setup.cfg, setup.dtype
    train = train or policy.train(dtype)
    e, stored = ELEM[dtype], ELEM[train.master_dtype or dtype]
    world, layers = dp * sp, cfg.layers
    tokens = setup.shape.batch * setup.shape.shard_len(sp)

    def host(seconds: float) -> float:  # CPU ranks share a host's cores
        return c.host_seconds(seconds, seconds * world, world)

    key = ("layer", sp)
    if key not in setup.cache:
        setup.cache[key] = (
            host(block_gemm_seconds(c, cfg, tokens, dtype)),
            host(block_gemm_seconds(c, cfg, tokens, dtype, ("w1", "w2", "w3"))),
            host(_stream_seconds(c, elementwise_bytes(cfg, tokens, e))),
            host(3 * head_flops(cfg, tokens) / gemm_rate(c, dtype, min(tokens, cfg.hidden))
                 + _stream_seconds(c, 4 * tokens * cfg.vocab * 4)))  # logits: fp32 passes
    g, mlp, ew, hd = setup.cache[key]
    a_f, a_all = attn.forward_ms / 1e3, attn.attention_ms / 1e3
    mode, frac = train.checkpoint, train.seq_fraction
    share = {"none": 0.0, "full": 1.0, "sc++": 1.0}.get(mode, frac)
    recompute = share * (g + ew) + (a_f if mode == "full" else 0.0)
    if train.tiled:
        recompute += (1.0 - share) * mlp
    compute = 3 * (g + ew) + a_all + recompute
    key = ("comm", dp, sp, policy.states, train.master_dtype)
    if key not in setup.cache:
        setup.cache[key] = _comm(setup, dp, sp, policy, train)
    comm = setup.cache[key]
    link = 2 * comm.gather + comm.scatter + _attention_link(c, attn, setup.per_node) \
        + (_attention_link(c, attn, setup.per_node, True) if mode == "full" else 0.0)
    offload = 0.0
    if train.offload and c.host_link_gb_per_s:
        shard = block_numel(cfg) / policy.shards(dp, sp, setup.per_node)
        moved = 3 * stored * shard if "params" in train.offload else 0.0
        if "activations" in train.offload:
            moved += 2 * block_bytes(cfg, setup.shape.batch, setup.shape.shard_len(sp), dtype,
                                     train, memory.attention_held(attn.algorithm, setup.shape, sp,
                                                                  attn.options))
        offload = moved / (c.host_link_gb_per_s * 1e9)
    block = max(compute, link, offload)
    last = max(compute, link + comm.reduce, offload)
    edges = comm.gather + comm.scatter + comm.root
    micro = layers * block + hd + edges
    micro_last = layers * last + hd + edges + comm.reduce_root
    m = setup.micro_batches(dp)
    optimizer = _optimizer_seconds(setup, cfg, policy, train, dp, sp)
    seconds = (m - 1) * micro + micro_last + optimizer

    parts = {"attention": m * layers * attn.compute_ms / 1e3,
             "other_compute": m * (layers * 3 * (g + ew) + hd),
             "recompute": m * layers * recompute, "optimizer": optimizer}
    parts["exposed_comm"] = max(0.0, seconds - sum(parts.values()))
    tps = setup.tokens_per_step
    sequences = tps / setup.seq_len
    if "flops" not in setup.cache:
        setup.cache["flops"] = tuple(step_flops(cfg, 1, setup.seq_len, conv) * sequences
                                     for conv in ("full", "halved"))
    full, halved = setup.cache["flops"]
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
                full / peak, halved / peak, mem["peak"], fits, {k: 1e3 * parts[k] for k in PARTS},
                mem)


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
    numel = params(cfg) / policy.shards(dp, sp, setup.per_node)
    nbytes = ADAM_PASSES * stored * numel
    if "optimizer" in train.offload and c.host_memory_gb_per_s and c.host_link_gb_per_s:
        crossing = 0.0 if "params" in train.offload else 2 * stored * numel  # grads out, params in
        cpu = nbytes / (c.host_memory_gb_per_s * 1e9 / setup.per_node)
        return cpu + crossing / (c.host_link_gb_per_s * 1e9)
    return c.host_seconds(_stream_seconds(c, nbytes), _stream_seconds(c, nbytes) * dp * sp, dp * sp)


@lru_cache(maxsize=64)
def params(cfg: ModelConfig) -> int:
    return cfg.params()


def _policy_of_case(case: Any) -> tuple[Policy, TrainPolicy]:
    """A training trial's policy as the planner's and the runner's."""
    frac = f"{case.seq_fraction:g}"
    ck = {"sequence": f"seq:{frac}", "sc++,sequence": f"sc++,seq:{frac}"}.get(case.checkpoint,
                                                                          case.checkpoint)
    offload = case.offload if isinstance(case.offload, tuple | list) else \
        (("optimizer", "params") if case.offload else ())
    tiled = bool(getattr(case, "tiled", False))
    policy = Policy("replicated" if case.states == "replicated" else "dp_sp", ck, case.fused_head,
                    tuple(offload), tiled)
    train = TrainPolicy(states=case.states, master_dtype=case.master_dtype, offload=tuple(offload),
                        checkpoint=case.checkpoint, seq_fraction=case.seq_fraction,
                        fused_head=case.fused_head, tiled=tiled)
    return policy, train


def predict_trial(spec: Any, cluster: Cluster) -> Any:
    """A prediction for any ExperimentSpec: an attention trial's (`api.Prediction`), or a training
    trial's `Step` (its model, DP x SP, its policy), `memory` holding the step's memory parts."""
    if spec.train is None:
        return predict_spec(spec, cluster)
    case = spec.to_case()
    cfg, dtype = case.config(), spec.workload.dtype
    setup = Setup(cluster, cfg, case.seq_len, case.seq_len * case.batch * case.dp, case.world,
                  max(1, spec.plan.nodes), dtype, case.batch, cluster.kernel or "flash2")
    attn = replace(setup.attention(case.sp, case.algorithm, dict(spec.plan.options), case.layout),
                   options=dict(spec.plan.options))
    policy, train = _policy_of_case(case)
    return step(setup, case.dp, case.sp, attn, policy, train)
