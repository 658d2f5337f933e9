"""Memory per rank: what an attention layer holds for its backward, and a training step's peak.

Activation unit A = B x (N/P) x H x D elements (one q-sized activation of a rank's shard; WallFacer
Eq. 8 with hidden = H x D). Held for backward, in units of A (K,V scaled by their heads over H):
ring, double ring, usp, burst and ulysses keep q, k, v (3A for MHA; usp's K,V after replication),
wallfacer keeps its team's C shards (3CA), allgather its gathered K,V. A step with checkpointing
(WallFacer Eq. 9-10) keeps L + 1 layer inputs and, at the peak, one layer's working set:

    PM = M_{m+o} + (L + 1) A + held        ring: (L + 4) A, wallfacer: (L + 3C + 1) A

A training step (--scope model | cluster) is counted the way the runner holds it (`step_memory`,
from `seqpar.rules.memory`): model states by the policy (replicated, FSDP-sharded over the ranks it
names, zero1's moments alone over all, or dist-opt's shards with its whole parameter and
gradient buffers; master dtype; offload; AdamW), the activations this
decoder keeps per checkpoint mode (none, full, sc++ (LoongTrain §5.2), sequence(f), sc++ +
sequence, seq-attn(f) (BurstEngine §3.2: out and lse of the tokens after the prefix); tiled MLP and
loss; activations offloaded), and the largest transient working set on top: one block's recompute
and backward beside the attention's own peak, or the head's logits; FSDP's gathered blocks; NCCL's
buffers, one set per communicator.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from seqpar.planner.schedule import RingStage, Schedule
from seqpar.rules.algorithms import usp
from seqpar.rules.algorithms.ulysses import kv_replicas
from seqpar.rules.counts import largest_layer_numel, layer_classes, layer_numel, routed_numel
from seqpar.rules.memory import (
    ELEM,
    AttentionHeld,
    TrainPolicy,
    block_working_set,
    comm_buffer_bytes,
    predicted_activations,
    predicted_states,
    tile_tokens,
)
from seqpar.rules.model import ModelConfig
from seqpar.rules.shape import AttnShape


def held(name: str, shape: AttnShape, world: int, options: Mapping[str, Any]) -> float:
    """Activations (in units of A) the attention keeps for its backward."""
    kv = shape.kv_heads / shape.heads
    if name in ("usp", "double_ring"):
        dhp = usp.grid_of(world, options)[0]
        kv = shape.kv_heads * kv_replicas(shape.kv_heads, dhp) / shape.heads
    elif name == "ulysses":
        kv = shape.kv_heads * kv_replicas(shape.kv_heads, world) / shape.heads
    if name == "wallfacer":
        return options.get("team_size", 1) * (1 + 2 * kv)
    if name == "allgather":
        return 1 + 2 * kv * world
    return 1 + 2 * kv


def attention_held(name: str, shape: AttnShape, world: int,
                   options: Mapping[str, Any]) -> AttentionHeld:
    """`_attention_held`, memoised (a search asks for it once per policy)."""
    key = (name, shape, world, tuple(sorted(options.items())))
    got = _HELD.get(key)
    if got is None:
        if len(_HELD) > 4096:
            _HELD.clear()
        got = _HELD[key] = _attention_held(name, shape, world, options)
    return got


_HELD: dict[tuple, AttentionHeld] = {}


def _attention_held(name: str, shape: AttnShape, world: int,
                    options: Mapping[str, Any]) -> AttentionHeld:
    """`held` as the model's memory count takes it: elements per token of the rank's shard, whether
    they are the attention's own inputs (sc++ recomputes those), whether its output changes layout."""
    d = shape.heads * shape.head_dim
    saved = held(name, shape, world, options) * d
    # ring, burst and wallfacer save q, k, v as they came; allgather and the double ring their q
    # (beside gathered or regrouped K,V, measured: benchmarks/train_memory.py); ulysses and usp
    # save head-layout copies
    recomputable = {"ulysses": 0.0, "usp": 0.0, "double_ring": d, "allgather": d}.get(name, saved)
    return AttentionHeld(saved=saved, recomputable=recomputable,
                         relayout=name in ("ulysses", "usp"))


def unit_bytes(shape: AttnShape, world: int) -> int:
    return shape.unit(world) * shape.heads  # B x s x H x D x e


def attention_peak(name: str, shape: AttnShape, world: int, options: Mapping[str, Any],
                   sched: Schedule) -> int:
    """Bytes one rank holds at the backward's peak: q, k, v, out, dout and dq, dk, dv of its shard,
    what it keeps for backward beyond its inputs, an fp32 dq accumulator and two in-flight
    messages per ring."""
    a = unit_bytes(shape, world)
    kv = shape.kv_heads / shape.heads
    inputs = 2 * (2 + 2 * kv) * a                   # q, k, v, out and their gradients
    kept = max(0.0, held(name, shape, world, options) - (1 + 2 * kv)) * a
    acc = a * 4 // shape.elem_bytes                 # dq accumulated in fp32
    msgs = max((2 * (st.msg + st.grad) for ph in sched.phases.values() for st in ph
                if isinstance(st, RingStage)), default=0)
    return int(inputs + kept + acc + msgs)


@lru_cache(maxsize=4096)
def _states(cfg: ModelConfig, dtype: str, policy: TrainPolicy, shards: int) -> int:
    return predicted_states(cfg, dtype, policy, shards)["device"]


# mesh axes (communicators) an algorithm's attention uses besides the whole SP group
AXES = {"usp": 2, "double_ring": 2, "wallfacer": 2, "burst": 2}


def communicators(name: str, sp: int, dp: int, states: str, per_node: int = 1,
                  ep: int = 1) -> int:
    """Communicators one rank holds: the attention's axes, the states' sharding group, and the
    group that reduces gradients over the ranks the states are not sharded over (zero1: one group,
    DP x SP, reduces the gradients and broadcasts the updated parameters); under expert
    parallelism its EP group and the group of ranks holding its experts."""
    attention = 0 if sp == 1 else 1 + AXES.get(name, 0)
    shards = {"dp_sp": dp * sp, "sp": sp, "node": min(per_node, dp * sp), "replicated": 1,
              "zero1": 1, "dist-opt": 1}[states]  # dist-opt: one group gathers and reduces
    experts = (ep > 1) + (1 < ep < dp * sp)
    return attention + (shards > 1) + (dp * sp // shards > 1) + experts


def step_memory(name: str, shape: AttnShape, world: int, options: Mapping[str, Any],
                cfg: ModelConfig, policy: TrainPolicy, attention_bytes: int, dtype: str,
                dp: int = 1, shards: int | None = None, comms: int = 0, ep: int = 1,
                skew: float = 1.0) -> dict[str, int]:
    """A training step's memory on one rank of an SP group of `world` ranks (DP `dp`): `states`
    (on the device; sharded over `shards` ranks, default all dp x world), `activations` (kept for
    backward), `transient` (the largest working set on top: one block's recompute and backward
    beside the attention's peak, or the head's logits; plus FSDP's gathered blocks and NCCL's
    buffers for `comms` communicators) and `peak`, their sum. Under expert parallelism over `ep`
    ranks (`planner.ep`) a rank holds its EP share of the routed experts (replicated: whole;
    FSDP: sharded over the ranks that hold them, as many as without EP), gathers that share alone
    (the runner keeps it for backward where nothing is recomputed), and holds the all-to-alls'
    buffers (the pairs it receives, `skew` x the mean, and the outputs it sends back) and its
    experts' activations for the pairs beyond the mean."""
    states = _states(cfg, dtype, policy, shards or world * dp)
    if ep > 1 and policy.states == "replicated":
        states = int(states * (1 - expert_share(cfg) * (1 - 1 / ep)))
    s = shape.shard_len(world)
    b = shape.batch
    held_by = attention_held(name, shape, world, options)
    acts = predicted_activations(cfg, b, s, dtype, policy, held_by)
    e = ELEM[dtype]
    head_tokens = tile_tokens(cfg, s) if policy.tiled else s  # the fused head tiles its own
    logits = 0 if policy.fused_head else b * head_tokens * cfg.vocab * (e + 2 * 4)
    block = block_working_set(cfg, b, s, dtype, policy, held_by)
    gathered = 0
    if policy.states == "fsdp":  # the largest block and the next (prefetched), one's gradients
        gathered = gathered_bytes(largest_layer_numel(cfg) if ep == 1 else
                                  largest_ep_numel(cfg, ep), dtype, policy)
    if ep > 1:
        pairs = b * s * cfg.experts_per_tok
        block += 2 * skew * pairs * cfg.hidden * e
        extra = (skew - 1) * pairs * 4 * cfg.moe_ffn * e  # one MoE block's experts' excess
        if policy.checkpoint == "none":
            acts += int(extra * len(cfg.moe_layers))
            if policy.states == "fsdp":  # the gathered experts, kept for their GEMMs' backward
                acts += routed_params(cfg) // ep * e
        else:
            block += extra
    transient = max(logits, attention_bytes + block) + gathered + comm_buffer_bytes(comms)
    return {"states": states, "activations": acts, "transient": int(transient),
            "peak": int(states + acts + transient)}


def gathered_bytes(numel: int, dtype: str, policy: TrainPolicy) -> int:
    """What FSDP holds gathered for a block of `numel` parameters: it and the next block
    (prefetched) in the compute dtype, and its gradients in the master dtype."""
    return numel * (2 * ELEM[dtype] + ELEM[policy.master_dtype or dtype])


@lru_cache(maxsize=256)
def routed_params(cfg: ModelConfig) -> int:
    """The routed experts' parameters, every MoE layer's."""
    return sum(c.count * routed_numel(cfg, c.first) for c in layer_classes(cfg) if c.moe)


def expert_share(cfg: ModelConfig) -> float:
    """The routed experts' share of the model's parameters."""
    return routed_params(cfg) / cfg.params()


@lru_cache(maxsize=1024)
def largest_ep_numel(cfg: ModelConfig, ep: int) -> int:
    """The parameters of the largest block a rank gathers under expert parallelism over `ep`
    ranks: its routed experts' EP share, the rest whole."""
    return max(layer_numel(cfg, c.first) - routed_numel(cfg, c.first) * (ep - 1) // ep
               for c in layer_classes(cfg))


def expert_parallelism(cfg: ModelConfig, dtype: str, policy: TrainPolicy, world: int,
                       memory_bytes: float, offloadable: bool) -> str | None:
    """Why a mixture of experts needs expert parallelism on `world` ranks of `memory_bytes` each
    (said where `--ep 1` is pinned), or None. The rule: the least FSDP (gathering every block
    whole, each step) could hold on a rank — its states sharded over every rank (none where they
    can be offloaded to the host), and
    the largest MoE block gathered (`gathered_bytes`), no activations — exceeds the device's
    memory, while with that block's routed experts split over the ranks (expert parallelism, each
    rank gathering its own experts only) it would not."""
    moe = [c.first for c in layer_classes(cfg) if c.moe]
    if not moe:
        return None
    states = 0 if offloadable else predicted_states(cfg, dtype, policy, world)["device"]
    layer = max(moe, key=lambda i: layer_numel(cfg, i))
    whole, routed = layer_numel(cfg, layer), routed_numel(cfg, layer)
    own = whole - routed + routed * -(-cfg.experts // world) // cfg.experts
    gathered, split = gathered_bytes(whole, dtype, policy), gathered_bytes(own, dtype, policy)
    if states + gathered <= memory_bytes or states + split > memory_bytes:
        return None
    return (f"needs expert parallelism (pinned to 1 here): FSDP gathers each MoE block whole, "
            f"{whole / 1e9:.2f}B parameters ({gathered / 1e9:.1f} GB with the next block "
            f"prefetched and its gradients) beside {states / 1e9:.1f} GB of states sharded over "
            f"{world} ranks, more than a GPU's {memory_bytes / 1e9:g} GB: leave --ep to the "
            f"search or pin one that divides the experts ({cfg.experts}) and the ranks")
