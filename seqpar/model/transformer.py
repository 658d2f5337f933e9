"""The decoder of every family `rules.model` describes (LLaMA's, with each family's changes:
`block.py`), trained with any registered sequence-parallel attention.

    net = Transformer(cfg, attention="ring", layout="zigzag", group=sp_group, checkpoint="sc++",
                      fused_head=True, seed=0, dtype=torch.bfloat16, master_dtype=torch.float32,
                      states="fsdp", device="cuda")
    opt = net.optimizer(lr=1e-3)   # AdamW over the master weights (sharded under fsdp)
    loss = net.loss(tokens)    # the FULL (batch, N + 1) batch, identical on every rank
    loss.backward()
    grads = net.full_grads()   # {name: full gradient}, identical on every rank, in every mode

The model shards the batch itself: this rank's inputs are tokens[:, pos] and its next-token labels
tokens[:, pos + 1], pos = `attend.positions(N, cu_seqlens)` (the one source of truth for
which tokens a rank holds), so a label that sits in another rank's shard under zigzag or stripe is
still the right one, and RoPE rotates every token by its global position. The loss is the mean
cross-entropy over all batch x N predictions (averaged over the data-parallel replicas too), plus,
where the model turns its load-balancing loss on (cfg.aux_loss_coef), the coefficient times that
loss over the whole sequence (as transformers' `output_router_logits`). Each layer attends with
the attention of its kind (`build_layers`: a sliding layer in its window); a tied model's head is
its embedding (one parameter, `embed`, under FSDP2 and the fused head alike).

Gradients are summed over the sequence-parallel group and averaged over `dp_group`: with
`states="replicated"` parameter by parameter while backward runs (`grads.py`; every .grad is then
the full gradient); with `states="fsdp"` by FSDP2's reduce-scatter over the whole DP x SP world
(`states.py`).
With `ep` > 1 every MoE layer's experts are spread over EP groups of `ep` consecutive ranks of the
DP x SP world (`model.ep`; `experts`: groups built before, else here, collectively), each rank
holding its slice, their gradients summed over the ranks holding the same experts.
`dtype` is the compute dtype; `master_dtype` (default: `dtype`) the parameters' dtype, so bf16
compute with fp32 master weights, moments and gradient reductions is `dtype=torch.bfloat16,
master_dtype=torch.float32`. Parameter names are the same in every mode.

A model of any size starts: under fsdp the parameters are created on the meta device, sharded,
then each rank writes only its own rows (`init.py`); `hf.load(net, path)` reads a Hugging Face
checkpoint into the shards instead. For the longest sequences: `offload` (a list from optimizer,
params, activations; CUDA only, `states.py`) and `tiled` (the MLP over token tiles of `mlp_tile`
tokens, default the hidden size, recomputed per tile: ALST's tiled MLP; the loss is tiled by the
fused head).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from seqpar.algorithms import Attention, Mesh, build_attention
from seqpar.algorithms.layouts import check_seq_len
from seqpar.algorithms.mesh import ExpertGroups
from seqpar.errors import require
from seqpar.model import checkpointing, deltanet, head, init, mla, moe
from seqpar.model import ep as ep_model
from seqpar.model import states as model_states
from seqpar.model.block import Block, RouterLog, layer_rope
from seqpar.model.config import ModelConfig
from seqpar.model.layers import norm, rotary_tables
from seqpar.rules import masks
from seqpar.rules.algorithms import check_mla_pass
from seqpar.rules.rope import attention_factor, inv_freq


@dataclass(frozen=True)
class SPGroup:
    """The attention a pack runs on and this rank's place in its group (a model holds its own
    group's; a dynamic step one per group size, `model.step`): `attend` deals the tokens (layer
    0's), `layers` each layer's (`build_layers`; (): `attend` in every layer)."""

    attend: Callable[..., torch.Tensor]
    rank: int
    world: int
    layers: tuple[Callable[..., torch.Tensor], ...] = ()

    def calls(self, n: int, cu_seqlens=None) -> list[Callable[..., torch.Tensor]]:
        """The attention each of n layers calls, with the call's documents."""
        layers = self.layers or (self.attend,) * n
        if cu_seqlens is None:
            return list(layers)
        return [functools.partial(a, cu_seqlens=cu_seqlens) for a in layers]


def layer_windows(cfg: ModelConfig, window: int | None = None) -> tuple[int | None, ...]:
    """Each layer's window: a sliding layer's the model's (cfg.window), the others' `window` (an
    attention option over the whole model; None: full causal)."""
    return tuple(cfg.window if kind == "sliding" else window for kind in cfg.layer_types)


def build_layers(name: str, cfg: ModelConfig, *, window: int | None = None, layout: str,
                 group: dist.ProcessGroup | None = None, mesh: Mesh | None = None,
                 mask: masks.Mask | None = None, **options: Any) -> tuple[Attention, ...]:
    """Each layer's attention `name`: one per distinct window (`layer_windows`), the first laid on
    `group` or `mesh`, the others on its mesh (no process group made twice), every one with the
    model's softmax scale (cfg.attn_scale; 0: the attention's default, head_dim^-1/2). A linear
    layer's is its gated DeltaNet under LASP on the same group (`deltanet.mixers`: options
    linear_sp, linear_backend)."""
    linear = {k: options.pop(k) for k in deltanet.OPTIONS if k in options}
    windows = layer_windows(cfg, window)
    kinds = list(dict.fromkeys(windows))
    sliding = "sliding" in cfg.layer_types
    require(window is None or not sliding, "window", window,
            f"must not be given for a model whose sliding layers have their own (model.window "
            f"{cfg.window})")
    require(mask is None or not sliding, "mask", "given",
            "must be None for a model with sliding layers (each layer's window is its relation)")
    require(layout != "balanced" or len(kinds) == 1, "layout", layout,
            "deals the tokens by one relation, and this model's layers have different windows "
            "(model.layer_types): use contiguous, zigzag or stripe")
    if cfg.attn_scale:
        given = options.get("scale")
        require(given is None or given == cfg.attn_scale, "scale", given,
                f"must be the model's softmax scale ({cfg.attn_scale}) or None")
        options = {**options, "scale": cfg.attn_scale}
    mla_pass = options.pop("mla_pass", "kv")  # MLA: what the ring carries (`mla.carrying`)
    check_mla_pass(mla_pass, cfg.mla, name)
    built: dict[int | None, Attention] = {}
    for w in kinds:
        first = next(iter(built.values()), None)
        place = {"group": group, "mesh": mesh} if first is None else {"mesh": first.mesh}
        built[w] = build_attention(name, causal=True, layout=layout, window=w, mask=mask,
                                   **place, **options)
    return deltanet.mixers(cfg, tuple(mla.carrying(built[w], mla_pass) for w in windows),
                           layout, mask, **linear)


@dataclass(frozen=True)
class Pack:
    """Whole sequences laid end to end as one micro-batch: (1, n) inputs and next-token labels,
    each token's position inside its sequence (RoPE) and the sequences' boundaries over n."""

    inputs: torch.Tensor
    labels: torch.Tensor
    rope: torch.Tensor
    cu: tuple[int, ...]
    real: int | None = None  # tokens before a padding document the loss leaves out (None: all)


class _SyncGrads(torch.autograd.Function):
    """Identity on the loss; its backward (the first node of every backward) starts the replicated
    gradients' reduction (`grads.GradSync`)."""

    @staticmethod
    def forward(ctx, loss, sync):
        ctx.sync = sync
        return loss.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.sync.begin()
        return grad, None


class Transformer(nn.Module):
    """The decoder; see the module docstring. Extra keyword options go to the attention algorithm."""

    def __init__(self, cfg: ModelConfig, attention: str = "local", layout: str = "contiguous",
                 group: dist.ProcessGroup | None = None, checkpoint: str = "none",
                 fused_head: bool = False, seed: int = 0, dtype: torch.dtype = torch.float32,
                 dp_group: dist.ProcessGroup | None = None, seq_fraction: float = 0.5,
                 head_tiles: tuple[int, int] = (1024, 8192), mesh: Mesh | None = None,
                 master_dtype: torch.dtype | None = None, states: str = "replicated",
                 offload: bool | Sequence[str] = (), device: torch.device | str | None = None,
                 tiled: bool = False, mlp_tile: int | None = None,
                 mask: masks.Mask | None = None, shard_group: dist.ProcessGroup | None = None,
                 ep: int = 1, experts: ExpertGroups | None = None, **attention_options: Any):
        super().__init__()
        if mesh is not None:  # a prebuilt DP x SP mesh (algorithms.mesh_for(..., dp=)) gives both
            require(mesh.real, "mesh", "views", "must be built collectively (algorithms.mesh_for)")
            group = mesh.comm("sp").group
            dp_group = mesh.comm("dp").group if "dp" in mesh.comms else None
        checkpointing.check_mode(checkpoint, seq_fraction)
        check_mla_pass(attention_options.get("mla_pass", "kv"), cfg.mla, attention, checkpoint)
        require(len(head_tiles) == 2 and all(isinstance(t, int) and t > 0 for t in head_tiles),
                "head_tiles", head_tiles, "must be two positive integers (tokens, vocabulary)")
        require(mlp_tile is None or (isinstance(mlp_tile, int) and mlp_tile > 0), "mlp_tile",
                mlp_tile, "must be a positive integer (tokens per MLP tile; None: hidden size)")
        device = torch.device("cpu" if device is None else device)
        self.policy = states_policy = model_states.StatePolicy(states, master_dtype, offload)
        states_policy.check(dtype, device)
        self.cfg, self.layout, self.group, self.dp_group = cfg, layout, group, dp_group
        self.checkpoint, self.seq_fraction = checkpoint, seq_fraction
        self.fused_head, self.head_tiles, self.dtype = fused_head, tuple(head_tiles), dtype
        self.device = device
        self.world = 1 if group is None else dist.get_world_size(group)
        self.rank = 0 if group is None else dist.get_rank(group)
        self.dp = 1 if dp_group is None else dist.get_world_size(dp_group)
        self.mask = mask  # any attention mask over N tokens (None: causal, documents per call)
        layers = build_layers(attention, cfg, layout=layout, group=group, mesh=mesh, mask=mask,
                              **attention_options)
        self.attend = layers[0]  # deals the tokens (every layer's deal, `build_layers`)
        self.sp = SPGroup(self.attend, self.rank, self.world, layers)
        self._inv_freq = {rope: torch.tensor(inv_freq(rope, mla.rope_width(cfg)),
                                             dtype=torch.float64)
                          for rope in {layer_rope(cfg, i) for i in range(cfg.layers)} if rope}
        sharded = states_policy.sharded  # fsdp, dist-opt: FSDP2 over the world
        stored, build_on = states_policy.param_dtype(dtype), torch.device("meta") if sharded else device
        d = cfg.hidden
        self.embed = nn.Parameter(torch.empty(cfg.vocab, d, dtype=stored, device=build_on))
        tile = (mlp_tile or cfg.hidden) if tiled else None  # ALST: ceil(N / hidden) tiles
        self.experts = ep_model.build(ep, experts, cfg, states_policy, checkpoint, tile, mesh,
                                      self.dp)  # expert parallelism (None: every rank all)
        self.router_log = RouterLog()
        self.blocks = nn.ModuleList(Block(cfg, i, stored, dtype, build_on, tile, self.router_log,
                                          self.experts) for i in range(cfg.layers))
        self.norm = nn.Parameter(torch.empty(d, dtype=stored, device=build_on))
        if not cfg.tie_embeddings:  # tied: the embedding is the head (`lm_head`)
            self.head = nn.Parameter(torch.empty(cfg.vocab, d, dtype=stored, device=build_on))
        if sharded:
            world_mesh = shard_mesh(mesh, group, dp_group, device, shard_group)
            model_states.shard_model(self, self.blocks, world_mesh, states_policy, dtype, self.dp,
                                     ignored=set(ep_model.expert_params(self)) if ep > 1 else None)
            self.to_empty(device=device)
        self.reset_parameters(seed)
        reduced = not sharded and (group is not None or dp_group is not None)
        self.sync = ep_model.grad_sync(self, group, dp_group, self.dp) if reduced else None
        # the ranks ZeRO-1 shares the moments over: those whose gradients are reduced alike
        zero1 = states_policy.states == "zero1" and (reduced or shard_group is not None)
        self.states_group = (shard_mesh(mesh, group, dp_group, device, shard_group).get_group()
                             if zero1 else None)

    def optimizer(self, lr: float) -> torch.optim.Optimizer:
        """AdamW over the parameters, ZeRO-1's under states='zero1' (`model.states.optimizer`)."""
        return model_states.optimizer(self.parameters(), self.policy, self.states_group, lr)

    def w(self, p: torch.Tensor) -> torch.Tensor:
        return p if p.dtype == self.dtype else p.to(self.dtype)

    @property
    def lm_head(self) -> nn.Parameter:
        """The LM head's weight: the embedding where the model ties them."""
        return self.embed if self.cfg.tie_embeddings else self.head

    def reset_parameters(self, seed: int) -> None:
        """Norm weights 1 (0 where stored as 1 + w), biases 0, every matrix N(0, 0.02^2), each
        rank drawing only the rows it holds (`init.py`): the same seed gives the same parameters
        on every rank, at every world size and in every `states` mode, and no rank ever holds a
        whole parameter it does not own."""
        init.init_parameters(self, seed, self.cfg.norm_offset)
        if self.experts is not None:
            ep_model.init_experts(self, seed, self.experts, self.cfg.experts, self.cfg.norm_offset)

    def shard(self, tokens: torch.Tensor, cu_seqlens=None
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(positions, inputs, labels) of this rank's tokens from the full (batch, N + 1) batch;
        with packed documents (`cu_seqlens`, boundaries over N) the layout deals each document."""
        require(tokens.dim() == 2 and tokens.shape[1] >= 2, "tokens.shape", tuple(tokens.shape),
                "must be (batch, N + 1) with N >= 1")
        n = tokens.shape[1] - 1
        if self.mask is not None:
            require(cu_seqlens is None and self.mask.n == n, "tokens.shape", tuple(tokens.shape),
                    f"must hold N + 1 = {self.mask.n + 1} tokens a row for the model's mask, and "
                    "no cu_seqlens (masks.documents carries documents)")
        elif cu_seqlens is None:
            check_seq_len(self.layout, self.world, n)
        tokens = tokens.to(self.device)
        pos = self.attend.positions(n, cu_seqlens, self.mask).to(self.device)
        return pos, tokens[:, pos], tokens[:, pos + 1]

    def hidden(self, tokens: torch.Tensor, cu_seqlens=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Final-norm hidden states of this rank's tokens and their labels."""
        pos, inp, labels = self.shard(tokens, cu_seqlens)
        return self._hidden(inp, pos, self.sp.calls(self.cfg.layers, cu_seqlens)), labels

    def rope_tables(self, pos: torch.Tensor) -> dict:
        """{a layer's RoPE: (cos, signed sin)} at positions `pos` (`layers.rotary_tables`); a
        layer that does not rotate (None) gets empty tables."""
        out = {}
        for rope, freqs in self._inv_freq.items():
            out[rope] = rotary_tables(pos, freqs, self.dtype, attention_factor(rope))
        empty = torch.empty(1, len(pos), 1, 0, dtype=self.dtype, device=pos.device)
        out[None] = (empty, empty)
        return out

    def _hidden(self, inp: torch.Tensor, rope_pos: torch.Tensor,
                attends: Sequence[Callable[..., torch.Tensor]]) -> torch.Tensor:
        cfg = self.cfg
        tables = self.rope_tables(rope_pos)
        x = F.embedding(inp, self.w(self.embed))
        if cfg.embed_scale:  # sqrt(hidden) rounded as the reference's float32 buffer, then cast
            x = x * torch.tensor(math.sqrt(cfg.hidden), dtype=torch.float32).to(x.device, x.dtype)
        for blk, attend in zip(self.blocks, attends, strict=True):
            x = blk(x, *tables[blk.rope], attend, self.checkpoint, self.seq_fraction)
        return norm(x, self.w(self.norm), cfg.norm_eps, cfg.norm_offset)

    def _head_sum(self, h: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The summed cross-entropy of hidden states h against labels."""
        if self.fused_head:  # the stored weight: its tiles are cast as used, its gradient fp32
            return head.fused_loss_sum(h, self.lm_head, labels, *self.head_tiles)
        return head.unfused_loss_sum(h, self.w(self.lm_head), labels)

    def pack_loss_sum(self, pack: Pack, sp: SPGroup) -> torch.Tensor:
        """This rank's summed cross-entropy over its share of `pack` (whole sequences packed as
        documents, the same on every rank of `sp`'s group): the layout deals the pack over the
        group, RoPE turns each token by its place in its own sequence. Not normalised: a step
        divides by its tokens (`model.step`)."""
        n = pack.inputs.shape[1]
        pos = sp.attend.positions(n, pack.cu).to(self.device)
        inp = pack.inputs.to(self.device)[:, pos]
        labels = pack.labels.to(self.device)[:, pos]
        h = self._hidden(inp, pack.rope.to(self.device)[pos], sp.calls(self.cfg.layers, pack.cu))
        if pack.real is not None and pack.real < n:  # the padding document has no labels
            keep = pos < pack.real
            h, labels = h[:, keep], labels[:, keep]
        return self._head_sum(h, labels)

    def forward(self, tokens: torch.Tensor | None = None, cu_seqlens=None, *,
                pack: Pack | None = None, sp: SPGroup | None = None) -> torch.Tensor:
        """This rank's share of the mean loss: its tokens' cross-entropy sum / (batch x N); with
        `pack`, its summed cross-entropy over its share of the pack on `sp`'s group
        (`pack_loss_sum`: through the module call, so FSDP2 gathers the root's parameters). With
        offload 'activations', what autograd saves goes to pinned host memory."""
        if "activations" in self.policy.offload:
            with torch.autograd.graph.save_on_cpu(pin_memory=True):
                return self._loss_share(tokens, cu_seqlens, pack, sp)
        return self._loss_share(tokens, cu_seqlens, pack, sp)

    def _loss_share(self, tokens: torch.Tensor | None, cu_seqlens=None, pack: Pack | None = None,
                    sp: SPGroup | None = None) -> torch.Tensor:
        if pack is not None:
            return self.pack_loss_sum(pack, sp or self.sp)
        assert tokens is not None
        with self.router_log.recording() as stats:
            h, labels = self.hidden(tokens, cu_seqlens)
        share = self._head_sum(h, labels) / (tokens.shape[0] * (tokens.shape[1] - 1))
        if not self.cfg.aux_loss_coef:
            return share
        # the load-balancing loss of the whole sequence (its sums all-reduced over the SP group),
        # a 1/world share on each rank: the ranks' shares add up to it once
        aux = moe.aux_loss(stats, self.cfg, self.group)
        return share + self.cfg.aux_loss_coef * aux / self.world

    def loss(self, tokens: torch.Tensor, cu_seqlens=None) -> torch.Tensor:
        """Mean next-token cross-entropy over the whole batch (+ the load-balancing loss where the
        model has one; the same value on every rank);
        backward leaves the reduced gradients (full under replicated, shards under fsdp).
        `cu_seqlens`: packed documents [0, ..., N]; attention stays inside each document."""
        local = self(tokens, cu_seqlens)
        if self.group is None and self.dp_group is None:
            return local
        value = local.detach().clone()
        if self.group is not None:
            dist.all_reduce(value, group=self.group)
        if self.dp_group is not None:
            dist.all_reduce(value, group=self.dp_group)
            value /= self.dp
        out = local + (value - local).detach()
        return out if self.sync is None else _SyncGrads.apply(out, self.sync)

    def full_grads(self) -> dict[str, torch.Tensor]:
        """{parameter name: the full gradient}, identical on every rank, in every `states` mode (under
        fsdp an all-gather per parameter: every rank must call it)."""
        return {name: ep_model.full(self.experts, name, p.grad, self.cfg.experts)
                for name, p in self.named_parameters() if p.grad is not None}


def shard_mesh(mesh: Mesh | None, group: dist.ProcessGroup | None,
               dp_group: dist.ProcessGroup | None, device: torch.device,
               shard_group: dist.ProcessGroup | None = None):
    """The 1-D DeviceMesh FSDP shards over: the whole DP x SP world of this model, or
    `shard_group` (a dynamic step's pool)."""
    from torch.distributed.device_mesh import DeviceMesh

    if shard_group is not None:
        return DeviceMesh.from_group(shard_group, device.type, mesh_dim_names=("dp_sp",))
    if mesh is not None:
        return mesh.shard_mesh(device.type)

    if dp_group is None:
        base = group if group is not None else dist.group.WORLD
    else:
        sp = 1 if group is None else dist.get_world_size(group)
        require(sp * dist.get_world_size(dp_group) == dist.get_world_size(), "dp_group",
                "given", "states='fsdp' with separate SP and DP groups needs them to span the world "
                "(else pass mesh=algorithms.mesh_for(..., dp=))")
        base = dist.group.WORLD
    require(base is not None, "states", "fsdp", "needs an initialised process group")
    return DeviceMesh.from_group(base, device.type, mesh_dim_names=("dp_sp",))
