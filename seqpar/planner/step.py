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

Expert parallelism (`Policy.ep`, `ep.py`): an MoE block's routed experts over its EP group of ep
ranks, their GEMMs over the pairs the group routes to them; the dispatch and combine all-to-alls
(forward, backward, and the recompute's) on the compute path and on their links' busy time
(part `ep_comm`); the experts' FSDP traffic over the ranks that hold them (`fsdp.traffic`).
The LM head and loss: 3 x 2·tokens·d·V at the GEMM rate plus the logits' element-wise passes.
What ranks sharing a host's cores cost one another: `contention`. TGS = tokens per step / (step
time x ranks); `mfu`, `mfu_unmasked_attention` and `hfu` as `rules.flops` defines them (the
attention by its area under the step's mask; hfu with the kernels' 2.5x backward and the recompute).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from seqpar.planner import contention, host, memory
from seqpar.planner import ep as ep_mod
from seqpar.planner.api import Prediction
from seqpar.planner.compute import (  # noqa: F401  (layer_seconds: lengths_costs' and lengths')
    class_seconds,
    head_seconds,
    layer_seconds,
    linear_at_rate,
    stream_seconds,
)
from seqpar.planner.fsdp import Traffic, traffic
from seqpar.planner.policy import Policy
from seqpar.planner.setup import MlaPrediction, Setup
from seqpar.rules.counts import layer_numel, routed_numel
from seqpar.rules.flops import conventions, recomputed_flops
from seqpar.rules.memory import (
    ELEM,
    TrainPolicy,
    block_bytes,
    blocks_bytes,
    predicted_states,
    zero1_partition,
)
from seqpar.rules.model import ModelConfig

# where a step's time goes: the attention's kernels, its own exposed communication (as the attention
# scope predicts it), the rest of the compute, the recompute, the exposed communication besides the
# attention's (FSDP, DP reductions, links shared past the compute), the optimizer, `host`: the
# host's time the device's does not hide (a CPU host's: its issue, what its ranks cost each other)
PARTS = ("attention", "attention_comm", "other_compute", "recompute", "exposed_comm", "optimizer",
         "host", "ep_comm")  # ep_comm: expert parallelism's all-to-alls, exposed
LINKS = ("intra", "inter")
BACKWARD_SHARE = 2 / 3  # of a micro-batch's time: two of its three passes (the matmuls' rule)
ADAM_PASSES = 7  # AdamW reads parameter, gradient, two moments; writes parameter, two moments


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
    # one layer's attention (forward + backward, ms) of each kind the model has: full, sliding
    attention_kinds: dict[str, float] = field(default_factory=dict)
    # expert parallelism: bytes a rank sends a step in the all-to-alls, by link (the busiest's)
    ep_bytes: dict[str, int] = field(default_factory=dict)
    linear_sp: str | None = None  # a hybrid's linear layers: lasp2 | lasp1 (None: no linear layer)

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
                **({"mla_pass": self.attention.mla_pass}
                   if isinstance(self.attention, MlaPrediction) else {}),
                **({"linear_sp": self.linear_sp} if self.linear_sp else {}),
                "micro_batches": self.micro_batches,
                "predicted": {"step_ms": round(self.step_ms, 3), "tgs": round(self.tgs, 2),
                              "mfu": round(self.mfu, 4),
                              "mfu_unmasked_attention": round(self.mfu_unmasked_attention, 4),
                              "hfu": round(self.hfu, 4),
                              "attention_layer_ms": round(self.attention_ms, 3),
                              "attention_layer_ms_by_kind": {
                                  k: round(v, 3) for k, v in self.attention_kinds.items()},
                              "peak_mem_bytes": self.peak_mem_bytes,
                              "parts_ms": {k: round(v, 3) for k, v in self.parts.items()},
                              "host_bound": self.host_bound, "memory": self.memory,
                              **({"ep_bytes": self.ep_bytes} if self.ep_bytes else {})},
                "fits": self.fits, "dominated_by": self.dominated_by}


@dataclass(frozen=True)
class Block:
    """A class of alike layers as one micro-step runs each of them, on one rank (seconds)."""

    layers: tuple[int, ...]   # the class's layer indices
    time: float           # max(its compute path, offload, each link's busy time)
    last: float           # the same in the last micro-step (with the data-parallel reduction)
    attention: float      # its attention, forward + backward, with its exposed communication
    kernels: float        # its attention's kernels and the work beside them
    other: float          # its GEMMs and element-wise work, forward + backward
    recompute: float
    comm: Traffic
    ep_comm: float = 0.0  # its expert parallelism's all-to-alls on the compute path
    ep_bytes: tuple[int, int] = (0, 0)  # what they send, intra- and inter-node

    @property
    def count(self) -> int:
        return len(self.layers)


def layer_kinds(setup: Setup, sp: int, attn: Prediction) -> dict[str, Prediction]:
    """One layer's attention of each kind (`Setup.kinds`), a linear layer's rule at its kernel's
    rate (`compute.linear_at_rate`; under `linear_sp` auto LASP-2's or LASP-1's, the faster)."""
    kinds = setup.kinds(sp, attn)
    if "linear" in kinds:
        if (key := ("linear at rate", sp)) not in setup.cache:  # once an SP size, asked often
            modes = ("lasp2", "lasp1") if setup.linear_sp == "auto" and sp > 1 else (None,)
            setup.cache[key] = min(
                (linear_at_rate(setup.cluster, setup.cfg, setup.dtype, setup.linear(sp, mode))
                 for mode in modes), key=lambda p: p.attention_ms)
        kinds = {**kinds, "linear": setup.cache[key]}
    return kinds


def _blocks(setup: Setup, dp: int, sp: int, attn: Prediction, policy: Policy,
            train: TrainPolicy, kinds: dict[str, Prediction]) -> list[Block]:
    """Each class of the model's layers (`Setup.classes`) as a micro-step runs it: its GEMMs and
    element-wise work, its attention (a sliding layer's under its window), its checkpoint mode's
    recompute, its FSDP traffic (a block of its own size) on links shared with the attention,
    and its offload."""
    c, cfg, dtype = setup.cluster, setup.cfg, setup.dtype
    stored = ELEM[train.master_dtype or dtype]
    mode, frac = train.checkpoint, train.seq_fraction
    share = {"none": 0.0, "full": 1.0, "sc++": 1.0, "seq-attn": 1.0}.get(mode, frac)
    out = []
    for cl in setup.classes:
        a = kinds[cl.kind]
        moe_ep = policy.ep if cl.moe else 1
        g, mlp, ew = class_time(setup, sp, cl.first, moe_ep)
        # the attention's forward that backward runs again: the whole (full), the prefix (seq-attn)
        again = {"full": a, "seq-attn": setup.prefix(sp, attn, frac, cl.kind)
                 if mode == "seq-attn" and frac > 0 else None}.get(mode)
        recompute = share * (g + ew) + (again.forward_ms / 1e3 if again is not None else 0.0)
        if train.tiled:
            recompute += (1.0 - share) * mlp
        a_all = a.attention_ms / 1e3
        a2a, runs = _all_to_all(setup, dp, sp, moe_ep), ep_mod.runs(share)
        exposed = (1 - ep_mod.EP_OVERLAP) * (runs * a2a.seconds + (1 + share) * a2a.counts)
        compute = 3 * (g + ew) + a_all + recompute + exposed
        numel = layer_numel(cfg, cl.first)
        key = ("comm", dp, sp, policy.states, train.master_dtype, numel, moe_ep)
        if key not in setup.cache:
            # the states' traffic on the host's own links where a trial emulates others (the
            # runner emulates its algorithms' and EP's transfers, not FSDP2's nor the reductions)
            net = setup.cache.get("states net", setup.net)
            setup.cache[key] = traffic(net, cfg, dtype, dp, sp, policy, train, numel,
                                       routed_numel(cfg, cl.first) if moe_ep > 1 else 0)
        comm = setup.cache[key]
        busy = {k: (a.link_ms[k] + (again.forward_link_ms[k] if again is not None else 0.0)) / 1e3
                + runs * a2a.busy(k) for k in LINKS}
        offload = 0.0
        if train.offload and c.host_link_gb_per_s:
            shard = numel / policy.shards(dp, sp, setup.per_node)
            moved = 3 * stored * shard if "params" in train.offload else 0.0
            if "activations" in train.offload:
                held = memory.attention_held(attn.algorithm, setup.shape, sp, attn.options)
                moved += 2 * block_bytes(cfg, setup.shape.batch, setup.shape.shard_len(sp), dtype,
                                         train, held, cl.first)
            offload = moved / (c.host_link_gb_per_s * 1e9)
        out.append(Block(
            cl.layers, max(compute, offload, *(comm.busy(k) + busy[k] for k in LINKS)),
            max(compute, offload, *(comm.busy(k, last=True) + busy[k] for k in LINKS)),
            a_all, a.compute_ms / 1e3, 3 * (g + ew), recompute, comm, exposed,
            (round(runs * a2a.cost.intra), round(runs * a2a.cost.inter))))
    return out


def _all_to_all(setup: Setup, dp: int, sp: int, ep: int) -> ep_mod.A2A:
    """One all-to-all of an MoE block under expert parallelism over `ep` ranks (memoised)."""
    if ep < 2:
        return ep_mod.NONE
    key = ("a2a", dp, sp, ep)
    got = setup.cache.get(key)
    if got is None:
        world = dp * sp
        groups = setup.cache.setdefault(("ep groups", world, ep), ep_mod.groups(world, ep))
        tokens = setup.shape.batch * setup.shape.shard_len(sp)
        got = setup.cache[key] = ep_mod.all_to_all(
            setup.net, setup.cluster, setup.cfg, tokens, ep, ELEM[setup.dtype],
            setup.routing_skew, groups)
    return got


def step(setup: Setup, dp: int, sp: int, attn: Prediction, policy: Policy,
         train: TrainPolicy | None = None) -> Step:
    """The step of one configuration (`train`: the runner's exact policy, default policy's)."""
    c, cfg, dtype = setup.cluster, setup.cfg, setup.dtype
    train = train or policy.train(dtype)
    world = dp * sp
    mode, frac = train.checkpoint, train.seq_fraction
    kinds = layer_kinds(setup, sp, attn)
    blocks = _blocks(setup, dp, sp, attn, policy, train, kinds)
    hd = head_time(setup, sp)
    first = blocks[0].comm  # layer 0's class; the last layer's scatter closes a micro-step
    closing = next(b.comm for b in blocks if cfg.layers - 1 in b.layers)
    edges = first.gather.seconds + closing.scatter.seconds + first.root
    micro = sum(b.count * b.time for b in blocks) + hd + edges
    micro_last = sum(b.count * b.last for b in blocks) + hd + edges + first.reduce_root
    m = setup.micro_batches(dp)
    optimizer = _optimizer_seconds(setup, cfg, policy, train, dp, sp)
    device = (m - 1) * micro + micro_last + optimizer + first.update.seconds
    linear_sp = kinds["linear"].algorithm if "linear" in kinds else None
    issue_micro, issue_step, queued = _host_issue(setup, attn, train, dp, sp, linear_sp)
    last_stretch = host.stretch(c, micro_last, issue_micro)
    # GradSync posts each gradient's all-reduce as backward writes it: their waits run beside
    # the last backward, what is left is exposed
    hidden = min(queued, BACKWARD_SHARE * last_stretch)
    shared = m * contention.micro_seconds(setup, sp, world, attn, train, blocks, hd, linear_sp)
    seconds = ((m - 1) * host.stretch(c, micro, issue_micro) + last_stretch + shared
               + host.stretch(c, optimizer + first.update.seconds, issue_step) - hidden)

    parts = {"attention": m * sum(b.count * b.kernels for b in blocks),
             "attention_comm": m * sum(b.count * (b.attention - b.kernels) for b in blocks),
             "other_compute": m * (sum(b.count * b.other for b in blocks) + hd),
             "recompute": m * sum(b.count * b.recompute for b in blocks),
             "optimizer": optimizer, "host": seconds - device,
             "ep_comm": m * sum(b.count * b.ep_comm for b in blocks)}
    parts["exposed_comm"] = max(0.0, seconds - sum(parts.values()))
    tps = setup.step_tokens(dp)
    pairs = setup.pairs
    recomputed = recomputed_flops(cfg, setup.batch, setup.seq_len, sp, mode, frac,
                                  pairs) * world * m
    flops = conventions(cfg, tps // setup.seq_len, setup.seq_len, pairs, recomputed)
    peak = c.peak(dtype) * world * seconds
    shards = policy.shards(dp, sp, setup.per_node)
    mem = memory.step_memory(attn.algorithm, setup.shape, sp, attn.options, cfg, train,
                             attn.peak_mem_bytes, dtype, dp=dp, shards=shards,
                             comms=memory.communicators(attn.algorithm, sp, dp, policy.states,
                                                        setup.per_node, policy.ep)
                             if c.cores is None else 0, ep=policy.ep, skew=setup.routing_skew)
    mem["host"] = _host_bytes(setup, cfg, train, policy, attn, dp, sp)
    fits = mem["peak"] <= c.memory_gb * 1e9 and (
        c.host_memory_gb is None or mem["host"] * setup.per_node <= c.host_memory_gb * 1e9)
    return Step(dp, sp, attn, policy, m, setup.kernel, 1e3 * seconds, tps / (seconds * world),
                flops["mfu"] / peak, flops["mfu_unmasked_attention"] / peak, flops["hfu"] / peak,
                mem["peak"], fits, {k: 1e3 * parts[k] for k in PARTS}, mem,
                host_bound=host.bound(c, device, m * issue_micro + issue_step),
                attention_kinds={k: p.attention_ms for k, p in kinds.items()},
                ep_bytes={k: m * sum(b.count * b.ep_bytes[i] for b in blocks)
                          for i, k in enumerate(LINKS)} if policy.ep > 1 else {},
                linear_sp=linear_sp)


def _host_issue(setup: Setup, attn: Prediction, train: TrainPolicy, dp: int, sp: int,
                linear_sp: str | None = None) -> tuple[float, float, float]:
    """(a micro-batch's, the step's own) host issue seconds on one rank (`planner.host`), a CPU
    host's cores shared out among its ranks, and the waits of the step's own that a backward
    hides (`host.queued_seconds`; memoised per configuration)."""
    c, world = setup.cluster, dp * sp
    key = ("host", sp, attn.algorithm, tuple(sorted(attn.options.items())), attn.layout,
           train.checkpoint, train.fused_head, world, linear_sp)
    micro = setup.cache.get(key)
    if micro is None:
        cost = (host.issue_cost(c, host.step_issue(setup, attn, train, sp, linear_sp),
                                setup.kernel, world) if host.issues(c) else (0.0, 0.0))
        micro = setup.cache[key] = host.on_host(c, cost, world)
    return micro, *host_once(setup, train.states, world)


def host_once(setup: Setup, states: str, world: int) -> tuple[float, float]:
    """(the step's own host issue seconds, the waits of it a backward hides) under the runner's
    `states` (a TrainPolicy's) on `world` ranks (memoised)."""
    key = ("host once", states, world)
    once = setup.cache.get(key)
    if once is None:
        c = setup.cluster
        once = setup.cache[key] = (
            host.on_host(c, host.step_seconds(c, setup.cfg, states=states, world=world,
                                              kernel=setup.kernel), world),
            host.queued_seconds(c, setup.cfg, states=states, world=world))
    return once


def class_time(setup: Setup, sp: int, layer: int, ep: int = 1) -> tuple[float, float, float]:
    """`compute.class_seconds` of layer `layer`'s class for one rank of an SP group of sp, its
    experts spread over `ep` ranks (memoised per sp, class and ep)."""
    key = ("layer", sp, layer, ep)
    got = setup.cache.get(key)
    if got is None:
        tokens = setup.shape.batch * setup.shape.shard_len(sp)
        got = setup.cache[key] = class_seconds(setup.cluster, setup.cfg, setup.dtype, tokens,
                                               setup.world, layer, ep, setup.routing_skew)
    return got


def head_time(setup: Setup, sp: int) -> float:
    """`compute.head_seconds` for one rank of an SP group of sp (memoised per sp)."""
    key = ("head", sp)
    got = setup.cache.get(key)
    if got is None:
        tokens = setup.shape.batch * setup.shape.shard_len(sp)
        got = setup.cache[key] = head_seconds(setup.cluster, setup.cfg, setup.dtype, tokens,
                                              setup.world)
    return got


def _host_bytes(setup: Setup, cfg: ModelConfig, train: TrainPolicy, policy: Policy,
                attn: Prediction, dp: int, sp: int) -> int:
    """Bytes one rank keeps in host memory: offloaded states and activations."""
    if not train.offload:
        return 0
    host = predicted_states(cfg, setup.dtype, train, policy.shards(dp, sp, setup.per_node))["host"]
    if "activations" in train.offload:
        held = memory.attention_held(attn.algorithm, setup.shape, sp, attn.options)
        every, largest = blocks_bytes(cfg, setup.shape.batch, setup.shape.shard_len(sp),
                                      setup.dtype, train, held)
        host += max(0, every - min(cfg.layers, 2) * largest)  # all but the two on the device
    return int(host)


def _optimizer_seconds(setup: Setup, cfg: ModelConfig, policy: Policy, train: TrainPolicy,
                       dp: int, sp: int) -> float:
    c = setup.cluster
    stored = ELEM[train.master_dtype or setup.dtype]
    shards = policy.shards(dp, sp, setup.per_node)
    # zero1: the rank with the largest share of whole parameters steps last
    numel = max(zero1_partition(cfg, shards)) if train.states == "zero1" else params(cfg) / shards
    if policy.ep > 1 and train.states == "replicated":  # its EP share of the experts
        numel *= 1 - memory.expert_share(cfg) * (1 - 1 / policy.ep)
    nbytes = ADAM_PASSES * stored * numel
    if "optimizer" in train.offload and c.host_memory_gb_per_s and c.host_link_gb_per_s:
        crossing = 0.0 if "params" in train.offload else 2 * stored * numel  # grads out, params in
        cpu = nbytes / (c.host_memory_gb_per_s * 1e9 / setup.per_node)
        return cpu + crossing / (c.host_link_gb_per_s * 1e9)
    return c.host_seconds(stream_seconds(c, nbytes), stream_seconds(c, nbytes) * dp * sp, dp * sp)


@lru_cache(maxsize=64)
def params(cfg: ModelConfig) -> int:
    return cfg.params()
