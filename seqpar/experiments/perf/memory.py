"""Memory per rank: what an attention layer holds for its backward, and a training step's peak.

Activation unit A = B x (N/P) x H x D elements (one q-sized activation of a rank's shard; WallFacer
Eq. 8 with hidden = H x D). Held for backward, in units of A (K,V scaled by their heads over H):
ring, double ring, usp, burst and ulysses keep q, k, v (3A for MHA; usp's K,V after replication),
wallfacer keeps its team's C shards (3CA), allgather its gathered K,V. A step with checkpointing
(WallFacer Eq. 9-10) keeps L + 1 layer inputs and, at the peak, one layer's working set:

    PM = M_{m+o} + (L + 1) A + held        ring: (L + 4) A, wallfacer: (L + 3C + 1) A

A training step (--scope model) is counted the way the runner holds it (`step_memory`): model states
by the policy (replicated or FSDP-sharded over DP x SP, master dtype, offload; AdamW), the
activations this decoder keeps per checkpoint mode (`seqpar.model.memory.predicted_activations`:
none, full, sc++ (LoongTrain §5.2), sequence(f) (BurstEngine §3.2) and sc++ + sequence), and the
largest transient working set on top.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from seqpar.algorithms import usp
from seqpar.algorithms.base import AttnShape
from seqpar.algorithms.ulysses import kv_replicas
from seqpar.errors import require
from seqpar.experiments.perf.schedule import Ring, Schedule
from seqpar.model.config import ModelConfig, param_shapes
from seqpar.model.memory import (
    ELEM,
    AttentionHeld,
    TrainPolicy,
    predicted_activations,
    predicted_states,
)


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
    """`held` as the model's memory count takes it: elements per token of the rank's shard, whether
    they are the attention's own inputs (sc++ recomputes those), whether its output changes layout."""
    d = shape.heads * shape.head_dim
    saved = held(name, shape, world, options) * d
    # ring, burst and wallfacer save q, k, v as they came; allgather its q (beside the gathered
    # K,V); ulysses, usp and double_ring save copies (head layout, or their context ring's)
    recomputable = {"ulysses": 0.0, "usp": 0.0, "double_ring": 0.0, "allgather": d}.get(name, saved)
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
                if isinstance(st, Ring)), default=0)
    return int(inputs + kept + acc + msgs)


def policy_of(name: str, dtype: str = "bfloat16") -> TrainPolicy:
    """A planner policy name as the runner's TrainPolicy: words among a states mode (`fsdp`,
    default, or `replicated`), a checkpoint mode (`none`, `full`, `sc++`, `seq:F`, `sc++,seq:F`),
    `fused` (the fused LM head) and `offload`; fp32 master weights for a 16-bit dtype, as a real
    run keeps them. E.g. 'fsdp sc++ fused', 'replicated seq:0.5', 'full'."""
    fields: dict[str, Any] = {"states": "fsdp", "checkpoint": "none", "seq_fraction": 0.5,
                              "master_dtype": "float32" if ELEM[dtype] < 4 else None}
    for word in name.split():
        if word in ("fsdp", "replicated"):
            fields["states"] = word
        elif word in ("fused", "offload"):
            fields["fused_head" if word == "fused" else "offload"] = True
        elif "seq:" in word:
            head, fraction = word.split("seq:", 1)
            fields["seq_fraction"] = float(fraction)
            fields["checkpoint"] = "sc++,sequence" if head.startswith("sc++") else "sequence"
        else:
            require(word in ("none", "full", "sc++"), "policy", name,
                    "words: fsdp|replicated, none|full|sc++|seq:F|sc++,seq:F, fused, offload")
            fields["checkpoint"] = word
    return TrainPolicy(**fields)


def policy_fraction(checkpoint: str) -> float:
    """The sequence fraction recomputed by a policy name: none 0, full 1, 'seq:0.5' 0.5."""
    if checkpoint == "none":
        return 0.0
    if checkpoint in ("full", "sc++"):
        return 1.0
    return float(checkpoint.split(":", 1)[1])


def step_memory(name: str, shape: AttnShape, world: int, options: Mapping[str, Any],
                cfg: ModelConfig, policy: TrainPolicy, attention_bytes: int, dtype: str,
                dp: int = 1) -> dict[str, int]:
    """A training step's memory on one rank, by the runner's own count (seqpar.model.memory):
    `states` (on the device), `activations` (kept for backward), `transient` (the largest working
    set on top of them: one attention backward, the head's logits, or FSDP's gathered block and
    its gradients) and `peak`, their sum."""
    states = predicted_states(cfg, dtype, policy, world * dp)["device"]
    s = shape.shard_len(world)
    acts = predicted_activations(cfg, shape.batch, s, dtype, policy,
                                 attention_held(name, shape, world, options))
    e = ELEM[dtype]
    logits = 0 if policy.fused_head else shape.batch * s * cfg.vocab * (e + 2 * 4)
    gathered = 0
    if policy.states == "fsdp":
        block = sum(n for k, n in _numels(cfg).items() if k.startswith("blocks.0."))
        gathered = 2 * block * e + block * ELEM[policy.master_dtype or dtype]
    transient = max(logits, attention_bytes) + gathered
    return {"states": states, "activations": acts, "transient": int(transient),
            "peak": int(states + acts + transient)}


def _numels(cfg: ModelConfig) -> dict[str, int]:
    out = {}
    for k, shape in param_shapes(cfg).items():
        n = 1
        for size in shape:
            n *= size
        out[k] = n
    return out


def step_peak(name: str, shape: AttnShape, world: int, options: Mapping[str, Any], cfg: ModelConfig,
              checkpoint: str | TrainPolicy, attention_bytes: int, dtype: str = "bfloat16",
              dp: int = 1) -> int:
    """Peak bytes of a training step (`step_memory`'s peak) under a policy or a checkpoint name."""
    policy = checkpoint if isinstance(checkpoint, TrainPolicy) else policy_of(checkpoint, dtype)
    return step_memory(name, shape, world, options, cfg, policy, attention_bytes, dtype, dp)["peak"]
