"""A training policy as the planner ranks it: where model states live (`states`), the checkpoint
mode, the fused LM head, offload to host memory and tiling — each its own field, and the space of
them a search walks (narrowed by the user's filters).

`states`: `dp_sp` shards them over every rank (FSDP over DP x SP, torchtitan's and LoongTrain
§5.1's hybrid ZeRO over data x sequence ranks), `sp` over the sequence-parallel group only
(replicated over DP: HSDP), `node` over the GPUs of a node (replicated across nodes: AMSP's partial
sharding, which LoongTrain §5.1 adopts), `replicated` nowhere, `zero1` AdamW's moments alone over
every rank (ZeRO-1: parameters and gradients replicated, torch's ZeroRedundancyOptimizer),
`dist-opt` Megatron-LM's distributed optimizer over every rank (master weights and moments sharded,
parameters gathered and gradients accumulated whole through a step: one all-gather and one
reduce-scatter a step, no equal micro-batch counts; searched only when pinned).
`checkpoint`: none, full, sc++ (LoongTrain §5.2), seq:F (the runner's `sequence`: the token-wise
layers of the first F of a rank's tokens recomputed, the attention kept whole), sc++,seq:F,
seq-attn:F (BurstEngine §3.2's sequence-level selective checkpointing: the block recomputed, the
attention re-run for the prefix of F·N tokens, out and lse of the rest kept; ring, burst or local
attention over stripe, or zigzag at F = 1/2). `offload`: drawn from optimizer, params, activations.
`tiled`: the tiled MLP and loss (ALST). `ep`: expert parallelism, a mixture of experts' routed
experts spread over groups of `ep` consecutive ranks (`planner.ep`; 1 for a dense model). Mixed
precision keeps fp32 master weights for a 16-bit compute dtype, as a real run does.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from seqpar.errors import ConfigError, require
from seqpar.rules.memory import ELEM, OFFLOADS, TrainPolicy, check_seq_attn

STATES = ("dp_sp", "sp", "node", "replicated", "zero1", "dist-opt")
# parameters and gradients whole on every rank through a step (dist-opt: gathered once a step)
REPLICATED = ("replicated", "zero1", "dist-opt")
# in a fixed-length search only when asked for (`Filters.states`): there every rank runs as many
# micro-batches, FSDP's case; a plan of lengths searches it (what lets the dynamic policy shard)
PINNED = ("dist-opt",)
CHECKPOINTS = ("none", "full", "sc++", "seq:0.5", "sc++,seq:0.5", "seq-attn:0.5")
FORMS = "none, full, sc++, seq:F, sc++,seq:F or seq-attn:F (0 <= F <= 1)"
# offload sets a search tries (each a list drawn from OFFLOADS)
# (the runner's rules, `rules.memory.check_offload`: 'params' moves the optimizer's states too, and
# only under sharded states)
OFFLOAD_SETS: tuple[tuple[str, ...], ...] = ((), ("activations",), ("optimizer", "params"),
                                             ("optimizer", "params", "activations"))
# states that hold a mixture's experts under expert parallelism: FSDP over every rank (the experts
# sharded by EP, then over the ranks that hold the same experts) or replicated (each rank its EP
# group's share whole); the runner's fsdp and replicated
EP_STATES = ("dp_sp", "replicated")


@dataclass(frozen=True)
class Policy:
    states: str = "dp_sp"
    checkpoint: str = "full"
    fused_head: bool = False
    offload: tuple[str, ...] = ()
    tiled: bool = False
    ep: int = 1

    def __post_init__(self) -> None:
        fields = (self.states, self.checkpoint, self.offload, self.ep)
        try:
            offload = _checked(*fields)
        except TypeError:  # a field that does not hash: checked as it is
            offload = _checked.__wrapped__(*fields)
        object.__setattr__(self, "offload", offload)

    def train(self, dtype: str) -> TrainPolicy:
        """The runner's TrainPolicy (fp32 master weights for a 16-bit dtype)."""
        return _train(self, dtype)

    def shards(self, dp: int, sp: int, per_node: int = 1) -> int:
        """Ranks the states are sharded over (zero1: the moments' ranks)."""
        return {"dp_sp": dp * sp, "sp": sp, "node": min(per_node, dp * sp),
                "replicated": 1, "zero1": dp * sp, "dist-opt": dp * sp}[self.states]

    def runs(self, algorithm: str, layout: str, world: int, seq_len: int,
             causal: bool = True) -> bool:
        """Whether this policy can train that attention configuration (seq-attn's rules,
        `rules.memory.check_seq_attn`; every other mode trains any)."""
        if not self.checkpoint.startswith("seq-attn"):
            return True
        return _seq_attn_runs(self.checkpoint, algorithm, layout, world, seq_len, causal)

    def fields(self) -> dict[str, Any]:
        return {"states": self.states, "checkpoint": self.checkpoint,
                "fused_head": self.fused_head, "offload": list(self.offload), "tiled": self.tiled,
                "ep": self.ep}

    def label(self) -> str:
        """Short: states, checkpoint, +fh (fused head), off:opa (optimizer, params, activations
        offloaded), +tile, ep4 (expert parallelism over 4 ranks)."""
        parts = [self.states, self.checkpoint]
        parts += ["+fh"] if self.fused_head else []
        parts += [f"off:{''.join(o[0] for o in self.offload)}"] if self.offload else []
        parts += ["+tile"] if self.tiled else []
        parts += [f"ep{self.ep}"] if self.ep > 1 else []
        return " ".join(parts)


@lru_cache(maxsize=1024)
def _checked(states: str, checkpoint: str, offload: Any, ep: int) -> tuple[str, ...]:
    """A policy's fields checked, and its offload in OFFLOADS' order (memoised: a search builds
    thousands of policies of a few dozen kinds)."""
    require(states in STATES, "states", states, f"must be one of {', '.join(STATES)}")
    require(ep == 1 or states in EP_STATES, "states", states,
            f"does not hold experts under expert parallelism (ep {ep}): {' or '.join(EP_STATES)}")
    check_checkpoint(checkpoint)
    require(all(o in OFFLOADS for o in offload), "offload", list(offload),
            f"must be a list drawn from {', '.join(OFFLOADS)}")
    return tuple(o for o in OFFLOADS if o in offload)


@lru_cache(maxsize=4096)
def _train(policy: Policy, dtype: str) -> TrainPolicy:
    mode, fraction = split_checkpoint(policy.checkpoint)
    states = policy.states if policy.states in REPLICATED else "fsdp"
    return TrainPolicy(states=states,
                       master_dtype="float32" if ELEM[dtype] < 4 else None,
                       offload=policy.offload, checkpoint=mode, seq_fraction=fraction,
                       fused_head=policy.fused_head, tiled=policy.tiled)


def check_checkpoint(name: str) -> None:
    split_checkpoint(name)


def seq_attn_runs(fraction: float, algorithm: str, layout: str, world: int, seq_len: int,
                  causal: bool = True) -> bool:
    """`Policy(checkpoint=f"seq-attn:{fraction:g}").runs(...)`, without building the policy."""
    return _seq_attn_runs(f"seq-attn:{fraction:g}", algorithm, layout, world, seq_len, causal)


@lru_cache(maxsize=4096)
def _seq_attn_runs(checkpoint: str, algorithm: str, layout: str, world: int, seq_len: int,
                   causal: bool) -> bool:
    """`Policy.runs` under seq-attn, memoised (a plan asks ~3,300 times of ~130 cases)."""
    try:
        check_seq_attn(algorithm, layout, split_checkpoint(checkpoint)[1], world, seq_len,
                       causal=causal)
    except ConfigError:
        return False
    return True


def split_checkpoint(name: str) -> tuple[str, float]:
    """A planner checkpoint name as (the runner's mode, its sequence fraction)."""
    return _split(name) if type(name) is str else _split.__wrapped__(name)


@lru_cache(maxsize=256)
def _split(name: str) -> tuple[str, float]:
    """`split_checkpoint`, memoised (a search asks thousands of times of a few names)."""
    if name.startswith("seq-attn"):
        head, colon, fraction = name.partition(":")
        require(head == "seq-attn" and colon, "checkpoint", name,
                f"must be one of {FORMS}: seq-attn:F names the recomputed prefix F")
        return "seq-attn", _fraction(name, fraction)
    if "seq:" in name:
        head, _, fraction = name.partition("seq:")
        require(head in ("", "sc++,"), "checkpoint", name, f"must be one of {FORMS}")
        return ("sc++,sequence" if head else "sequence"), _fraction(name, fraction)
    require(name in ("none", "full", "sc++"), "checkpoint", name, f"must be one of {FORMS}")
    return name, 0.5


def _fraction(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    require(0.0 <= value <= 1.0, "checkpoint", name, "F must be a number 0 <= F <= 1")
    return value


def name_of(mode: str, fraction: float) -> str:
    """The planner's name of a runner checkpoint mode and fraction (split_checkpoint's inverse)."""
    f = f"{fraction:g}"
    return {"sequence": f"seq:{f}", "sc++,sequence": f"sc++,seq:{f}",
            "seq-attn": f"seq-attn:{f}"}.get(mode, mode)


@dataclass(frozen=True)
class Filters:
    """What the user pinned (None: search it)."""

    dp: int | None = None
    sp: int | None = None
    algorithm: str | None = None
    layout: str | None = None
    states: str | None = None
    checkpoint: str | None = None
    fused_head: bool | None = None
    offload: tuple[str, ...] | None = None
    tiled: bool | None = None
    options: tuple[tuple[str, Any], ...] = ()  # algorithm options pinned (`pins.parse`)
    ep: int | None = None  # expert parallelism pinned (`planner.ep`)

    def __post_init__(self) -> None:
        require(self.states is None or self.states in STATES, "states", self.states,
                f"must be one of {', '.join(STATES)}")
        if self.checkpoint is not None:
            check_checkpoint(self.checkpoint)
        if self.offload is not None:
            require(all(o in OFFLOADS for o in self.offload), "offload", list(self.offload),
                    f"must be a list drawn from {', '.join(OFFLOADS)} (none for [])")
            require(self.states not in REPLICATED or "params" not in self.offload, "offload",
                    ",".join(self.offload), f"'params' moves FSDP's sharded states (FSDP2's CPU "
                    f"offload): not with states {self.states}")
        require(self.ep is None or self.ep == 1 or self.states is None
                or self.states in EP_STATES, "states", self.states,
                f"does not hold experts under expert parallelism (ep {self.ep}): "
                f"{' or '.join(EP_STATES)}")
        for name in ("dp", "sp", "ep"):
            value = getattr(self, name)
            require(value is None or value >= 1, name, value, "must be at least 1")


def space(filters: Filters = Filters(), dp: int = 1, offload_sets: Sequence[tuple[str, ...]]
          = OFFLOAD_SETS, tiled: Sequence[bool] = (False, True), sp: int = 1,
          per_node: int = 1, pinned: Sequence[str] = PINNED, eps: Sequence[int] = (1,)
          ) -> list[Policy]:
    """Every policy the filters leave for a DP x SP split; a states choice that shards over the
    same ranks as another (`sp` at DP = 1, `node` on one node or with SP = a node, `zero1` and
    `dist-opt` on one rank: replicated) is left out, and the `pinned` ones unless asked for.
    `eps`: the expert-parallel degrees (`planner.ep.degrees`), each beside `EP_STATES` only."""
    f = filters
    same = {"sp": dp == 1, "node": not 1 < per_node < dp * sp or per_node == sp,
            "zero1": dp * sp == 1, "dist-opt": dp * sp == 1}
    states = [f.states] if f.states else [s for s in STATES
                                          if not same.get(s, False) and s not in pinned]
    checkpoints = [f.checkpoint] if f.checkpoint else list(CHECKPOINTS)
    fused = [f.fused_head] if f.fused_head is not None else [False, True]
    offloads = [tuple(f.offload)] if f.offload is not None else list(offload_sets)
    tiles = [f.tiled] if f.tiled is not None else list(tiled)
    ep_of = [f.ep] if f.ep else list(eps)
    return [Policy(s, c, h, o, t, e) for e in ep_of for s, c, h, o, t in
            itertools.product(states, checkpoints, fused, offloads, tiles)
            if (s not in REPLICATED or "params" not in o)  # 'params' moves FSDP's states only
            and (e == 1 or s in EP_STATES)]
