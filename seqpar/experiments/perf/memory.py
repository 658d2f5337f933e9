"""Memory per rank: what an attention layer holds for its backward, and a training step's peak.

Activation unit A = B x (N/P) x H x D elements (one q-sized activation of a rank's shard; WallFacer
Eq. 8 with hidden = H x D). Held for backward, in units of A (K,V scaled by their heads over H):
ring, double ring, usp, burst and ulysses keep q, k, v (3A for MHA; usp's K,V after replication),
wallfacer keeps its team's C shards (3CA), allgather its gathered K,V. A step with checkpointing
(WallFacer Eq. 9-10) keeps L + 1 layer inputs and, at the peak, one layer's working set:

    PM = M_{m+o} + (L + 1) A + held        ring: (L + 4) A, wallfacer: (L + 3C + 1) A

Checkpoint policies for --scope model: none (every layer's activations), full (layer inputs only),
sc++ (LoongTrain §5.2: layer inputs and attention outputs, so attention is not recomputed), and a
sequence fraction f (BurstEngine §3.3: f of each layer's tokens checkpointed, the rest kept).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from seqpar.algorithms import usp
from seqpar.algorithms.base import AttnShape
from seqpar.algorithms.ulysses import kv_replicas
from seqpar.experiments.perf.schedule import Ring, Schedule
from seqpar.model.memory import AttentionHeld

# a transformer layer's activations besides q, k, v with FlashAttention, in units of A (bf16):
# Korthikanti et al. 2022 count 34·s·b·h bytes per layer = 17 A, of which q, k, v are 3 A
LAYER_REST = 14


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
    return AttentionHeld(saved=held(name, shape, world, options) * d,
                         inputs=name not in ("ulysses", "usp", "allgather"),
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


def policy_fraction(checkpoint: str) -> float:
    """The sequence fraction recomputed by a policy name: none 0, full 1, 'seq:0.5' 0.5."""
    if checkpoint == "none":
        return 0.0
    if checkpoint in ("full", "sc++"):
        return 1.0
    return float(checkpoint.split(":", 1)[1])


def model_states(params: int, world: int) -> int:
    """bf16 weights and gradients on every rank, fp32 master weights and Adam moments sharded over
    the world (ZeRO-1, as the papers run)."""
    return 4 * params + 12 * params // world


def step_peak(name: str, shape: AttnShape, world: int, options: Mapping[str, Any], layers: int,
              params: int, checkpoint: str, attention_bytes: int, vocab: int) -> int:
    """Peak bytes of a training step (WallFacer Eq. 9-10, extended by the checkpoint policy)."""
    a = unit_bytes(shape, world)
    layer = (LAYER_REST + held(name, shape, world, options)) * a
    logits = shape.batch * (shape.seq_len // world) * vocab * 4
    if checkpoint == "none":
        acts = layers * layer
    elif checkpoint == "full":
        acts = (layers + 1) * a + layer
    elif checkpoint == "sc++":
        acts = (2 * layers + 1) * a + layer
    else:
        f = policy_fraction(checkpoint)
        acts = layers * ((1 - f) * layer + f * a) + (layer if f > 0 else 0)
    return int(model_states(params, world) + acts + max(logits, attention_bytes))
