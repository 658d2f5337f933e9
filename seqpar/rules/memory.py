"""The bytes a training step holds, predicted: model states, the activations a forward keeps, the
working set of one block's recompute and backward, and the communicators' buffers.

`TrainPolicy` is everything but the shapes that decides them: the runner trains with it and the
planner ranks over it. Its counts are the runner's own (what `seqpar.model.memory.AllocationMeter`
and `state_bytes` measure on the decoder in `seqpar.model`), extended by the ALST techniques
(arXiv 2506.13996): `offload` (a list drawn from `optimizer`, `params`, `activations`) moves
optimizer moments, stored parameters with their gradients, or the checkpointed activations to host
memory; `tiled` runs the MLP and the loss over tiles of the sequence (ALST §3.1: tiles of `hidden`
tokens), so their wide intermediates exist for one tile at a time and are recomputed, not kept.

Pure Python: the planner imports this without torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from seqpar.errors import require
from seqpar.rules.counts import (
    ffn_width,
    layer_classes,
    layer_numel,
    norm_width,
    routing_width,
)
from seqpar.rules.linear import CHUNK
from seqpar.rules.model import ModelConfig, layer_shapes, numel, param_shapes

ELEM = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}
CHECKPOINT_MODES = ("none", "full", "sc++", "sequence", "sc++,sequence", "seq-attn")
# seq-attn joins a recomputed prefix's attention output and lse to the kept rest's and runs the
# attention's own backward on the whole: an attention whose backward needs q, k, v, out and lse in
# the sequence layout only (usp, ulysses, the double ring, allgather and WallFacer keep regrouped
# copies of their own)
SEQ_ATTN_ALGORITHMS = ("ring", "burst", "local")
# replicated: every state on every rank; fsdp: all of them sharded (FSDP2); zero1: the optimizer's
# moments sharded, parameters and gradients replicated (ZeRO stage 1, torch's ZeroRedundancyOptimizer);
# dist-opt: Megatron-LM's distributed optimizer on FSDP2 (master weights, gradients and moments
# sharded between steps; the parameters gathered and the gradients accumulated whole during one)
STATES = ("replicated", "fsdp", "zero1", "dist-opt")
SHARDED = ("fsdp", "dist-opt")  # parameters sharded by FSDP2
OFFLOADS = ("optimizer", "params", "activations")

# NCCL's buffers per connection of a communicator (nccl src/init.cc, defaults): the Simple
# protocol's NCCL_BUFFSIZE 4 MiB; LL 8 lines x 512 threads x 8 steps x 16 B = 512 KiB; LL128
# 120 elements x 640 threads x 8 steps x 8 B = 4.69 MiB
NCCL_CONNECTION_BYTES = (1 << 22) + 8 * 512 * 8 * 16 + 120 * 640 * 8 * 8
# an assumption, not a documented default: NCCL picks its channel count at init (NCCL_MAX_NCHANNELS
# caps it at 32); 16 channels with a ring's two connections each is typical of 8-GPU NVLink nodes
NCCL_CHANNELS = 16
NCCL_CONNECTIONS = 2


def offload_tuple(offload: bool | Sequence[str] | None) -> tuple[str, ...]:
    """The offload list in its one form, a tuple in `OFFLOADS` order (as `TrainPolicy` holds it;
    names it does not know last, for the check to name): a list as given; the old flag True
    (FSDP2's CPU offload) is ('optimizer', 'params'), False or None is ()."""
    if offload is None or offload is False:
        return ()
    if offload is True:
        return ("optimizer", "params")
    if isinstance(offload, str):
        return (offload,)
    order = OFFLOADS
    return tuple(sorted(offload, key=lambda o: (order.index(o) if o in order else len(order), str(o))))


@dataclass(frozen=True)
class TrainPolicy:
    """Everything but the shapes that decides a training step's memory."""

    states: str = "replicated"          # STATES
    master_dtype: str | None = None     # None: parameters in the compute dtype
    offload: tuple[str, ...] = ()       # drawn from OFFLOADS (True: optimizer and params, FSDP2's)
    checkpoint: str = "none"            # CHECKPOINT_MODES
    seq_fraction: float = 0.5           # sequence modes, seq-attn: the part of each shard recomputed
    fused_head: bool = False
    tiled: bool = False                 # tiled MLP and loss (ALST)

    def __post_init__(self) -> None:
        offload = self.offload
        if isinstance(offload, bool):  # the runner's older flag: FSDP2's CPU offload of states
            offload = offload_tuple(offload)
        require(isinstance(offload, tuple | list) and all(o in OFFLOADS for o in offload),
                "offload", offload, f"must be a list drawn from {', '.join(OFFLOADS)} ([] for none)")
        object.__setattr__(self, "offload", offload_tuple(offload))
        require(self.states in STATES, "states", self.states, f"must be one of {', '.join(STATES)}")
        check_offload(self.offload, self.states)
        require(self.checkpoint in CHECKPOINT_MODES, "checkpoint", self.checkpoint,
                f"must be one of {', '.join(CHECKPOINT_MODES)}")
        require(isinstance(self.tiled, bool), "tiled", self.tiled, "must be true or false")
        require(self.master_dtype is None or self.master_dtype in ELEM, "master_dtype",
                self.master_dtype, f"must be one of {', '.join(ELEM)} (or none)")

    def label(self) -> str:
        ckpt = self.checkpoint + (f"({self.seq_fraction:g})" if uses_fraction(self.checkpoint)
                                  else "")
        parts = [self.states + "".join(f"+offload:{o}" for o in self.offload), f"ckpt={ckpt}"]
        if self.master_dtype:
            parts.append(f"master={self.master_dtype}")
        if self.fused_head:
            parts.append("fused-head")
        if self.tiled:
            parts.append("tiled")
        return " ".join(parts)


def uses_fraction(mode: str) -> bool:
    """Whether a checkpoint mode takes `seq_fraction` (sequence, sc++,sequence, seq-attn)."""
    return "sequence" in mode or mode == "seq-attn"


def check_seq_attn(algorithm: str, layout: str, fraction: float, world: int, seq_len: int,
                   documents: bool = False, causal: bool = True) -> None:
    """seq-attn's rules (BurstEngine §3.2): the attention re-run in backward for the first F of
    every rank's tokens must be the attention of a global prefix, the first F·N tokens, on its own:
    the stripe layout (any F: the first round(F·N/P) rows of every rank) or zigzag (F = 1/2, N a
    multiple of 2P: rank r's first half is chunk r) deal a prefix so, at P = 1 every layout; no
    query may see a later key (causal attention; packed documents: the prefix is the packed row's
    first F·N tokens, whichever documents they belong to, so zigzag, which deals each document, is
    refused with them); and the attention must be one whose backward needs q, k, v, out and lse
    alone (`SEQ_ATTN_ALGORITHMS`)."""
    require(algorithm in SEQ_ATTN_ALGORITHMS, "checkpoint", "seq-attn",
            f"needs an attention whose backward takes q, k, v, out and lse in the sequence layout "
            f"({', '.join(SEQ_ATTN_ALGORITHMS)}), not {algorithm}")
    require(causal, "checkpoint", "seq-attn", "needs attention in which no query sees a later key "
            "(causal, packed documents, a causal window)")
    if world == 1:
        return
    if layout == "zigzag":
        require(fraction in (0.0, 0.5, 1.0) and not documents and seq_len % (2 * world) == 0,
                "layout", layout, "holds a global prefix in each rank's first half only: seq-attn "
                "with zigzag needs seq_fraction 0.5, one document and N a multiple of 2P (use "
                "stripe for any fraction or packed documents)")
        return
    require(layout == "stripe", "layout", layout, "does not deal a global prefix to the first "
            "tokens of every rank: seq-attn needs stripe (any seq_fraction) or zigzag (0.5)")


def prefix_layout(layout: str, world: int, fraction: float) -> str:
    """The layout the prefix's attention runs in under seq-attn: the stripe layout's first F of a
    rank's tokens are the stripe layout of the prefix; zigzag's first half (chunk r) is the
    contiguous layout of the prefix (its whole, at F = 1, zigzag's own)."""
    return "contiguous" if layout == "zigzag" and world > 1 and fraction == 0.5 else layout


def check_offload(offload: tuple[str, ...], states: str) -> None:
    """The offload rules that hold on any device (the runner adds: CUDA only).

    'params': FSDP2's CPUOffloadPolicy — the sharded parameters, their gradients and so the
    optimizer's states (it steps where the parameters live) in host memory; fsdp only.
    'optimizer': the optimizer's states in host memory; torch places them beside the parameters
    they update, so only together with 'params'. 'activations': what forward saves for backward
    in pinned host memory (`torch.autograd.graph.save_on_cpu`)."""
    shown = list(offload)
    require(len(set(offload)) == len(offload) and set(offload) <= set(OFFLOADS), "offload", shown,
            f"must be a list drawn from {', '.join(OFFLOADS)} ([] for none)")
    require("optimizer" not in offload or "params" in offload, "offload", shown,
            "'optimizer' needs 'params' too: torch keeps an optimizer's states beside the "
            "parameters they update (FSDP2's CPUOffloadPolicy steps it on the host)")
    require("params" not in offload or states != "dist-opt", "offload", shown,
            "not with states='dist-opt': its parameters and gradients stay gathered on the device "
            "through the step (Megatron's buffers); FSDP2's CPU offload is states='fsdp'")
    require("params" not in offload or states == "fsdp", "offload", shown,
            "'params' needs states='fsdp' (FSDP2's CPUOffloadPolicy moves the sharded states)")


def _local_numel(shape: tuple[int, ...], shards: int) -> int:
    """Elements of rank 0's shard of a parameter sharded on dim 0 over `shards` ranks (torch.chunk)."""
    rows = -(-shape[0] // shards)
    return rows * numel(shape[1:])


@lru_cache(maxsize=1024)
def _sharded_numel(cfg: ModelConfig, shards: int) -> int:
    """Elements of rank 0's shards of every parameter (each sharded on dim 0 over `shards`)."""
    blocks = sum(c.count * sum(_local_numel(s, shards) for s in layer_shapes(cfg, c.first).values())
                 for c in layer_classes(cfg))
    rest = sum(_local_numel(s, shards) for k, s in param_shapes(cfg).items()
               if not k.startswith("blocks."))
    return blocks + rest


@lru_cache(maxsize=1024)
def dist_opt_partition(cfg: ModelConfig, shards: int) -> tuple[int, ...]:
    """Elements each of `shards` ranks holds under dist-opt (and fsdp): FSDP2 shards every
    parameter on dim 0 as torch.chunk does (ceil(rows / shards) rows a rank, the last ranks fewer
    or none); a rank keeps the master weights, gradients and both moments of its rows."""
    held = [0] * shards
    for shape in param_shapes(cfg).values():
        rows, per = shape[0], -(-shape[0] // shards)
        for r in range(shards):
            held[r] += max(0, min(per, rows - r * per)) * numel(shape[1:])
    return tuple(held)


def dist_opt_bytes(cfg: ModelConfig, shards: int, param_bytes: int, grad_bytes: int) -> int:
    """Bytes one rank sends a step under dist-opt (NCCL-tests' convention, as the ledger books
    them): one all-gather of every parameter (its shard to each of the G - 1 others, `param_bytes`
    an element: the compute dtype) and one reduce-scatter of every gradient ((G - 1)/G of the
    whole, `grad_bytes` an element: the master dtype), FSDP2 padding each parameter's dim 0 to a
    multiple of G: (G - 1) x sum of ceil(rows / G) x cols x (param + grad bytes) — about
    (param + grad bytes) a parameter, 4 in bf16, 6 with fp32 gradients, 16 in float64."""
    if shards <= 1:
        return 0
    return (shards - 1) * _sharded_numel(cfg, shards) * (param_bytes + grad_bytes)


@lru_cache(maxsize=1024)
def zero1_partition(cfg: ModelConfig, shards: int) -> tuple[int, ...]:
    """Elements whose optimizer moments each of `shards` ranks holds under zero1: torch's
    ZeroRedundancyOptimizer deals whole parameters, largest first, each to the rank holding the
    fewest elements so far (the lowest such rank on a tie)."""
    held = [0] * shards
    for shape in sorted(param_shapes(cfg).values(), key=numel, reverse=True):
        held[held.index(min(held))] += numel(shape)
    return tuple(held)


def predicted_states(cfg: ModelConfig, dtype: str, policy: TrainPolicy, shards: int
                     ) -> dict[str, int]:
    """Bytes of model states one rank holds under AdamW: parameters (master dtype, or the compute
    dtype), their gradients, two moments; sharded over `shards` ranks under fsdp and dist-opt
    (rank 0's: `dist_opt_partition`), the moments alone under zero1 (the rank holding the most:
    `zero1_partition`); `buffers`, dist-opt's whole parameters (compute dtype) and gradients
    (master dtype) held through a step (what a rank holds between steps is the rest). `device` is what
    stays on the accelerator, `host` what offload 'params' moved (FSDP2's CPU offload: the
    parameters, their gradients and the moments that step beside them; `check_offload`)."""
    stored = ELEM[policy.master_dtype or dtype]
    n = shards if policy.states in SHARDED else 1
    count = _sharded_numel(cfg, n)
    moments = max(zero1_partition(cfg, shards)) if policy.states == "zero1" else count
    out = {"params": count * stored, "grads": count * stored, "optimizer": 2 * moments * stored,
           "buffers": 0}
    if policy.states == "dist-opt":  # Megatron's buffers, whole through a step: the parameters
        # gathered in the compute dtype, the gradients accumulated in the master's
        out["buffers"] = _sharded_numel(cfg, 1) * (ELEM[dtype] + stored)
    total = out["params"] + out["grads"] + out["optimizer"] + out["buffers"]
    hosted = "params" in policy.offload
    out["device"] = 0 if hosted else total
    out["host"] = total if hosted else 0
    return out


@dataclass(frozen=True)
class AttentionHeld:
    """What the distributed attention keeps for its backward, per token of the rank's shard, in
    elements: `saved` beside its output (ring's q, k, v; Ulysses' head-layout copies), how much of
    that is its own inputs as they came (`recomputable`: sc++ recomputes those from the block's
    input), and whether it returns an output that is a new tensor beside the one it saved (a layout
    change)."""

    saved: float
    recomputable: float
    relayout: bool = False


def linear_saved(cfg: ModelConfig, torch_rule: bool = True) -> float:
    """Elements a linear layer's mixer keeps for backward a token. torch's chunked rule (32/64-bit,
    `model.deltanet`): a value head's four chunk x chunk blocks a chunk (decay, UT system, scores,
    their product), eight dk- and dv-wide tensors; four conv_dim (the convolution's input, output,
    SiLU), gated output, gates, chunk states. fla (16-bit, GPU): q, k, v, convolved, z, b, a, states."""
    dk, dv, hv = cfg.lin_k_dim, cfg.lin_v_dim, cfg.lin_v_heads
    conv, state = 2 * cfg.lin_k_heads * dk + hv * dv, hv * dk * dv / CHUNK
    if torch_rule:
        return hv * (4 * CHUNK + 8 * dk + 8 * dv) + 4 * conv + hv * dv + 3 * hv + state
    return 2 * conv + hv * dv + 2 * hv + state


def block_elems(cfg: ModelConfig, attn: AttentionHeld, policy: TrainPolicy, lse_per_elem: float,
                batch: int, layer: int = 0, torch_rule: bool = True) -> float:
    """Elements block `layer` keeps for backward per token of the rank's shard (see
    `seqpar.model.checkpointing`): the two RMSNorms (their rsqrt, normalised input and scaled
    output), the residual sums, the gated feed-forward's four ffn-wide tensors (an MoE layer: k
    experts' and the shared ones', and its routing, `rules.counts`), the attention output (q wide)
    and what the attention saves, and the families' extra norms (Gemma's, QK-norm). A tiled MLP
    keeps only its tiles' input (a residual sum kept anyway): not the second RMSNorm nor the
    feed-forward's tensors."""
    d, h = cfg.hidden, cfg.heads
    mlp = 4 * ffn_width(cfg, layer) + routing_width(cfg, layer)
    lse, q = h * lse_per_elem, cfg.heads * cfg.head_dim
    out = q * (2 if attn.relayout else 1)
    attention = attn.saved + lse + out
    if cfg.layer_types[layer] == "linear":
        out = cfg.lin_v_heads * cfg.lin_v_dim
        attn, lse, q = AttentionHeld(linear_saved(cfg, torch_rule), 0.0), 0.0, out
        attention = attn.saved + out
    none = 2 * (2 * d + 1) + 2 * d + mlp + norm_width(cfg) + attention
    if policy.tiled:
        none -= (2 * d + 1) + mlp
    mode, frac = policy.checkpoint, policy.seq_fraction
    if mode == "none":
        return none
    if mode == "full":
        return d
    if mode == "seq-attn":  # the block's input, and out + lse of the tokens after the prefix
        return d + (1 - frac) * (out + lse)
    kept_attention = d + out + lse + attn.saved - attn.recomputable  # x, out(s), lse, copies
    if mode == "sc++":
        return kept_attention
    rest = (none - attention - d) * (1 - frac)
    if batch > 1:  # the kept part's output projection copies its slice of the attention output
        rest += q * (1 - frac)
    return (kept_attention if mode == "sc++,sequence" else attention + d) + rest


def _acc(e: int) -> int:
    return 8 if e == 8 else 4


def block_bytes(cfg: ModelConfig, batch: int, shard_tokens: int, dtype: str, policy: TrainPolicy,
                attn: AttentionHeld, layer: int = 0) -> int:
    """Bytes block `layer` keeps for backward on one rank (what `offload: activations` moves)."""
    e = ELEM[dtype]
    return int(batch * shard_tokens * e * block_elems(cfg, attn, policy, _acc(e) / e, batch, layer,
                                                      torch_rule=e >= 4))


def blocks_bytes(cfg: ModelConfig, batch: int, shard_tokens: int, dtype: str, policy: TrainPolicy,
                 attn: AttentionHeld) -> tuple[int, int]:
    """(every block's kept bytes together, the largest block's) on one rank."""
    each = [(c.count, block_bytes(cfg, batch, shard_tokens, dtype, policy, attn, c.first))
            for c in layer_classes(cfg)]
    return sum(n * b for n, b in each), max(b for _, b in each)


@lru_cache(maxsize=8192)
def predicted_activations(cfg: ModelConfig, batch: int, shard_tokens: int, dtype: str,
                          policy: TrainPolicy, attn: AttentionHeld) -> int:
    """Bytes a forward keeps for backward on one rank's device (what `AllocationMeter` measures over
    `net.loss`): embedding output, every block (two of them with `offload: activations`, the one in
    use and the one in flight), the final norm and the head, plus the compute-dtype weight copies
    that survive the forward (casts of fp32 master weights under replicated states; the root's
    gathered parameters under fsdp, which FSDP2 keeps until backward)."""
    e = ELEM[dtype]
    acc = _acc(e)
    t = batch * shard_tokens
    d, v = cfg.hidden, cfg.vocab
    per_token = d + (2 * d + 1)
    if policy.fused_head:  # dh and dw, computed in forward; the final norm's output is not kept
        per_token += d * acc / e - d
        head = v * d * acc
    else:
        per_token += v * acc / e  # the logits (the runner tiles the loss only in the fused head)
        head = 0
    every, largest = blocks_bytes(cfg, batch, shard_tokens, dtype, policy, attn)
    blocks = min(cfg.layers, 2) * largest if "activations" in policy.offload else every
    extra = 2 * shard_tokens * cfg.head_dim * e + (2 * batch + 1) * shard_tokens * 8  # rope, ids
    block_weights = sum(c.count * layer_numel(cfg, c.first) for c in layer_classes(cfg))
    casts = 0  # dist-opt's gathered parameters are its states' buffers
    if policy.states == "fsdp":
        casts = (2 * v * d + d) * e                        # the root's gathered parameters
    elif policy.master_dtype and ELEM[policy.master_dtype] != e and policy.states != "dist-opt":
        casts = ((0 if policy.fused_head else v * d) + d) * e  # the head's (unfused), the norm's
        if policy.checkpoint in ("none", "sequence", "sc++,sequence"):
            casts += block_weights * e                     # each block's casts, kept for backward
    return int(t * per_token * e + head + blocks + extra + casts)


def tile_tokens(cfg: ModelConfig, shard_tokens: int) -> int:
    """Tokens in one tile of the tiled MLP and loss (ALST: ceil(seqlen / hidden) tiles)."""
    return min(shard_tokens, cfg.hidden)


@lru_cache(maxsize=8192)
def block_working_set(cfg: ModelConfig, batch: int, shard_tokens: int, dtype: str,
                      policy: TrainPolicy, attn: AttentionHeld) -> int:
    """Bytes the largest block adds while it runs its backward: what its checkpoint mode
    recomputes (the whole block under full, all but the attention under sc++, a fraction under
    sequence modes) and the gradients that flow through it (dx in and out of the block, d wide
    each). With `tiled` the feed-forward's tensors exist for one tile only."""
    return max(_working_set(cfg, batch, shard_tokens, dtype, policy, attn, c.first)
               for c in layer_classes(cfg))


def _working_set(cfg: ModelConfig, batch: int, shard_tokens: int, dtype: str, policy: TrainPolicy,
                 attn: AttentionHeld, layer: int) -> int:
    e = ELEM[dtype]
    lse = _acc(e) / e
    no_mlp = TrainPolicy(checkpoint="none", tiled=True)
    kept = TrainPolicy(checkpoint=policy.checkpoint, seq_fraction=policy.seq_fraction, tiled=True)
    recomputed = (block_elems(cfg, attn, no_mlp, lse, batch, layer, e >= 4)
                  - block_elems(cfg, attn, kept, lse, batch, layer, e >= 4))
    t = batch * shard_tokens
    if policy.tiled:
        mlp_tokens = batch * tile_tokens(cfg, shard_tokens)
    else:
        frac = {"none": 0.0, "full": 1.0, "sc++": 1.0, "seq-attn": 1.0}.get(policy.checkpoint,
                                                                            policy.seq_fraction)
        mlp_tokens = t * frac
    mlp = 4 * ffn_width(cfg, layer) + routing_width(cfg, layer)
    return int((t * (max(0.0, recomputed) + 2 * cfg.hidden) + mlp * mlp_tokens) * e)


def comm_buffer_bytes(communicators: int) -> int:
    """Bytes NCCL holds on a rank for `communicators` communicators (one per mesh axis in use)."""
    return communicators * NCCL_CHANNELS * NCCL_CONNECTIONS * NCCL_CONNECTION_BYTES
