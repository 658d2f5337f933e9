"""Host memory a piece of code allocates, from the torch profiler's allocation events.

    with AllocationMeter() as mem:
        loss = net.loss(tokens)
    mem.retained   # bytes allocated inside and still alive at the end: what forward keeps for backward
    mem.peak       # the highest net allocation reached inside

Frees of tensors allocated before the block count as negative: drop references to earlier results
before entering (the caller's job).

Unlike a saved-tensor hook (`workers.bench.SavedTensorMeter`), this sees what checkpointing keeps
outside autograd's saved tensors (a checkpoint's inputs, the fused head's gradients) and what its
own hooks replace; unlike an RSS peak it is exact at small sizes. On a CUDA device it reads the
caching allocator instead (bytes allocated at the end minus at the start; the allocator's peak).

`state_bytes(net, optimizer)`: the bytes this rank holds for model states — parameters, gradients
and optimizer moments (a sharded parameter counts its local shard).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from seqpar.model.config import ModelConfig, param_shapes
from seqpar.model.states import offload_tuple


class AllocationMeter:
    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self._prof = (None if self.device.type == "cuda"
                      else profile(activities=[ProfilerActivity.CPU], profile_memory=True))
        self.retained = 0
        self.peak = 0
        self._base = 0

    def __enter__(self) -> AllocationMeter:
        if self._prof is None:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
        else:
            self._prof.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._prof is None:
            torch.cuda.synchronize(self.device)
            self.retained = torch.cuda.memory_allocated(self.device) - self._base
            self.peak = torch.cuda.max_memory_allocated(self.device) - self._base
            return
        self._prof.__exit__(*exc)
        # the raw allocation events, in time order (op-level totals would misplace frees)
        steps = sorted((e.start_ns(), e.nbytes()) for e in self._prof.profiler.kineto_results.events()
                       if e.name() == "[memory]" and e.device_type() == DeviceType.CPU)
        running = 0
        for _, delta in steps:
            running += delta
            self.peak = max(self.peak, running)
        self.retained = running


def _nbytes(t: torch.Tensor) -> int:
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.numel() * local.element_size()


def state_breakdown(net: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
    """Bytes this rank holds for parameters, gradients and optimizer states (local shards)."""
    params = list(net.parameters())
    out = {"params": sum(_nbytes(p) for p in params),
           "grads": sum(_nbytes(p.grad) for p in params if p.grad is not None),
           "optimizer": 0}
    if optimizer is not None:
        out["optimizer"] = sum(_nbytes(v) for state in optimizer.state.values()
                               for v in state.values() if isinstance(v, torch.Tensor))
    return out


def state_bytes(net: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> int:
    """The bytes this rank holds for model states: parameters, gradients and optimizer moments."""
    return sum(state_breakdown(net, optimizer).values())


# ------------------------------------------------------------------ the predicted bytes
@dataclass(frozen=True)
class TrainPolicy:
    """Everything but the shapes that decides a training step's memory: the runner trains with it
    (TrainCase) and the planner ranks over it (`seqpar plan --scope model`)."""

    states: str = "replicated"          # replicated | fsdp
    master_dtype: str | None = None     # None: parameters in the compute dtype
    offload: tuple[str, ...] = ()       # to host memory, from states.OFFLOAD (CUDA only; see there)
    checkpoint: str = "none"            # seqpar.model.checkpointing.MODES
    seq_fraction: float = 0.5           # sequence modes: the part of each shard recomputed
    fused_head: bool = False            # the tiled LM head and loss (BurstEngine §3.3)
    tiled: bool = False                 # the MLP over token tiles, recomputed per tile (ALST)

    def __post_init__(self) -> None:
        object.__setattr__(self, "offload", offload_tuple(self.offload))

    def label(self) -> str:
        ckpt = self.checkpoint + (f"({self.seq_fraction:g})" if "sequence" in self.checkpoint else "")
        parts = [self.states + "".join(f"+offload:{o}" for o in self.offload), f"ckpt={ckpt}"]
        if self.master_dtype:
            parts.append(f"master={self.master_dtype}")
        if self.fused_head:
            parts.append("fused-head")
        if self.tiled:
            parts.append("tiled-mlp")
        return " ".join(parts)


ELEM = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}


def _local_numel(shape: tuple[int, ...], shards: int) -> int:
    """Elements of rank 0's shard of a parameter sharded on dim 0 over `shards` ranks (torch.chunk)."""
    rows = -(-shape[0] // shards)
    rest = 1
    for n in shape[1:]:
        rest *= n
    return rows * rest


def predicted_states(cfg: ModelConfig, dtype: str, policy: TrainPolicy, shards: int
                     ) -> dict[str, int]:
    """Bytes of model states one rank holds under AdamW: parameters (master dtype, or the compute
    dtype), their gradients, two moments; sharded over `shards` ranks under fsdp. `device` is what
    stays on the accelerator (0 with offload "params": the host holds the rest, `host`)."""
    stored = ELEM[policy.master_dtype or dtype]
    n = shards if policy.states == "fsdp" else 1
    numel = sum(_local_numel(s, n) for s in param_shapes(cfg).values())
    out = {"params": numel * stored, "grads": numel * stored, "optimizer": 2 * numel * stored}
    total = sum(out.values())
    hosted = "params" in policy.offload  # FSDP2's CPU offload: parameters, gradients, moments
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


def block_elems(cfg: ModelConfig, attn: AttentionHeld, policy: TrainPolicy, lse_per_elem: float,
                batch: int) -> float:
    """Elements one block keeps for backward per token of the rank's shard (see `checkpointing`):
    the two RMSNorms (their rsqrt, normalised input and scaled output), the residual sums, SwiGLU's
    four ffn-wide tensors, the attention output and what the attention saves. A tiled MLP keeps
    only its tiles' input (a residual sum kept anyway): not the second RMSNorm nor SwiGLU's four."""
    d, f, h = cfg.hidden, cfg.ffn, cfg.heads
    lse = h * lse_per_elem
    out = d * (2 if attn.relayout else 1)
    attention = attn.saved + lse + out
    none = 2 * (2 * d + 1) + 2 * d + 4 * f + attention
    if policy.tiled:
        none -= (2 * d + 1) + 4 * f
    mode, frac = policy.checkpoint, policy.seq_fraction
    if mode == "none":
        return none
    if mode == "full":
        return d
    kept_attention = d + out + lse + attn.saved - attn.recomputable  # x, out(s), lse, copies
    if mode == "sc++":
        return kept_attention
    rest = (none - attention - d) * (1 - frac)
    if batch > 1:  # the kept part's output projection copies its slice of the attention output
        rest += d * (1 - frac)
    return (kept_attention if mode == "sc++,sequence" else attention + d) + rest


def predicted_activations(cfg: ModelConfig, batch: int, shard_tokens: int, dtype: str,
                          policy: TrainPolicy, attn: AttentionHeld) -> int:
    """Bytes a forward keeps for backward on one rank (what `AllocationMeter` measures over
    `net.loss`): embedding output, every block, the final norm and the head, plus the
    compute-dtype weight copies that survive the forward (casts of fp32 master weights under
    replicated states; the root's gathered parameters under fsdp, which FSDP2 keeps until
    backward)."""
    e = ELEM[dtype]
    acc = 8 if e == 8 else 4
    t = batch * shard_tokens
    d, v = cfg.hidden, cfg.vocab
    per_token = d + (2 * d + 1) + cfg.layers * block_elems(cfg, attn, policy, acc / e, batch)
    if policy.fused_head:  # dh and dw, computed in forward; the final norm's output is not kept
        per_token += d * acc / e - d
        head = v * d * acc
    else:
        per_token += v * acc / e
        head = 0
    extra = 2 * shard_tokens * cfg.head_dim * e + (2 * batch + 1) * shard_tokens * 8  # rope, ids
    shapes = param_shapes(cfg)
    block_weights = sum(_numel(s) for k, s in shapes.items() if k.startswith("blocks.0."))
    casts = 0
    if policy.states == "fsdp":
        casts = (2 * v * d + d) * e                        # the root's gathered parameters
    elif policy.master_dtype and ELEM[policy.master_dtype] != e:
        casts = ((0 if policy.fused_head else v * d) + d) * e  # the head's (unfused), the norm's
        if policy.checkpoint in ("none", "sequence", "sc++,sequence"):
            casts += cfg.layers * block_weights * e        # each block's casts, kept for backward
    return int(t * per_token * e + head + extra + casts)


def _numel(shape: tuple[int, ...]) -> int:
    out = 1
    for n in shape:
        out *= n
    return out
