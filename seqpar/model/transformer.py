"""A LLaMA-style decoder trained with any registered sequence-parallel attention.

    net = Transformer(cfg, attention="ring", layout="zigzag", group=sp_group, checkpoint="sc++",
                      fused_head=True, seed=0, dtype=torch.float64)
    loss = net.loss(tokens)    # the FULL (batch, N + 1) batch, identical on every rank
    loss.backward()            # every .grad is now the full gradient, identical on every rank

The model shards the batch itself: this rank's inputs are tokens[:, pos] and its next-token labels
tokens[:, pos + 1], pos = `layouts.positions(layout, rank, world, N)` (the one source of truth for
which tokens a rank holds), so a label that sits in another rank's shard under zigzag or stripe is
still the right one, and RoPE rotates every token by its global position. The loss is the mean
cross-entropy over all batch x N predictions (averaged over the data-parallel replicas too);
gradients are summed over the sequence-parallel group and averaged over `dp_group` in one
all-reduce each, at the end of backward.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from seqpar.algorithms import Mesh, build_attention
from seqpar.algorithms.layouts import check_seq_len, positions
from seqpar.errors import require
from seqpar.model import checkpointing, head
from seqpar.model.config import ModelConfig
from seqpar.model.layers import apply_rope, rms_norm, rope_tables, swiglu

INIT_STD = 0.02


class Block(nn.Module):
    """RMSNorm -> Q/K/V (GQA) -> RoPE -> attention -> O -> residual -> RMSNorm -> SwiGLU -> residual."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype):
        super().__init__()
        d, kv = cfg.hidden, cfg.kv_heads * cfg.head_dim

        def param(*shape: int) -> nn.Parameter:
            return nn.Parameter(torch.empty(*shape, dtype=dtype))

        self.cfg = cfg
        self.attn_norm, self.ffn_norm = param(d), param(d)
        self.wq, self.wk, self.wv, self.wo = param(d, d), param(kv, d), param(kv, d), param(d, d)
        self.w1, self.w3, self.w2 = param(cfg.ffn, d), param(cfg.ffn, d), param(d, cfg.ffn)

    def pre(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        c = self.cfg
        b, s, _ = x.shape
        h = rms_norm(x, self.attn_norm, c.norm_eps)
        q = F.linear(h, self.wq).view(b, s, c.heads, c.head_dim)
        k = F.linear(h, self.wk).view(b, s, c.kv_heads, c.head_dim)
        v = F.linear(h, self.wv).view(b, s, c.kv_heads, c.head_dim)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def post(self, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        x = x + F.linear(a.reshape(x.shape[0], x.shape[1], -1), self.wo)
        return x + swiglu(rms_norm(x, self.ffn_norm, self.cfg.norm_eps), self.w1, self.w3, self.w2)


class _SyncGrads(torch.autograd.Function):
    """Identity on the loss; its backward schedules the gradient all-reduce for the end of backward."""

    @staticmethod
    def forward(ctx, loss, net):
        ctx.net = net
        return loss.clone()

    @staticmethod
    def backward(ctx, grad):
        net = ctx.net
        before = [None if p.grad is None else p.grad.clone() for p in net.parameters()]
        torch.autograd.Variable._execution_engine.queue_callback(lambda: net._reduce_grads(before))
        return grad, None


class Transformer(nn.Module):
    """The decoder; see the module docstring. Extra keyword options go to the attention algorithm."""

    def __init__(self, cfg: ModelConfig, attention: str = "local", layout: str = "contiguous",
                 group: dist.ProcessGroup | None = None, checkpoint: str = "none",
                 fused_head: bool = False, seed: int = 0, dtype: torch.dtype = torch.float32,
                 dp_group: dist.ProcessGroup | None = None, seq_fraction: float = 0.5,
                 head_tiles: tuple[int, int] = (1024, 8192), mesh: Mesh | None = None,
                 **attention_options: Any):
        super().__init__()
        if mesh is not None:  # a prebuilt DP x SP mesh (algorithms.mesh_for(..., dp=)) gives both
            require(mesh.real, "mesh", "views", "must be built collectively (algorithms.mesh_for)")
            group = mesh.comm("sp").group
            dp_group = mesh.comm("dp").group if "dp" in mesh.comms else None
        checkpointing.check_mode(checkpoint, seq_fraction)
        require(len(head_tiles) == 2 and all(isinstance(t, int) and t > 0 for t in head_tiles),
                "head_tiles", head_tiles, "must be two positive integers (tokens, vocabulary)")
        self.cfg, self.layout, self.group, self.dp_group = cfg, layout, group, dp_group
        self.checkpoint, self.seq_fraction = checkpoint, seq_fraction
        self.fused_head, self.head_tiles, self.dtype = fused_head, tuple(head_tiles), dtype
        self.world = 1 if group is None else dist.get_world_size(group)
        self.rank = 0 if group is None else dist.get_rank(group)
        self.dp = 1 if dp_group is None else dist.get_world_size(dp_group)
        self.attend = build_attention(attention, causal=True, layout=layout, group=group,
                                      mesh=mesh, **attention_options)
        d = cfg.hidden
        self.embed = nn.Parameter(torch.empty(cfg.vocab, d, dtype=dtype))
        self.blocks = nn.ModuleList(Block(cfg, dtype) for _ in range(cfg.layers))
        self.norm = nn.Parameter(torch.empty(d, dtype=dtype))
        self.head = nn.Parameter(torch.empty(cfg.vocab, d, dtype=dtype))
        self.reset_parameters(seed)

    @torch.no_grad()
    def reset_parameters(self, seed: int) -> None:
        """Norm weights 1, every matrix N(0, 0.02^2) drawn in float64 from one generator in parameter
        order: the same seed gives the same parameters on every rank and at every world size."""
        gen = torch.Generator().manual_seed(seed)
        for p in self.parameters():
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * INIT_STD)

    def shard(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(positions, inputs, labels) of this rank's tokens from the full (batch, N + 1) batch."""
        require(tokens.dim() == 2 and tokens.shape[1] >= 2, "tokens.shape", tuple(tokens.shape),
                "must be (batch, N + 1) with N >= 1")
        n = tokens.shape[1] - 1
        check_seq_len(self.layout, self.world, n)
        pos = positions(self.layout, self.rank, self.world, n).to(tokens.device)
        return pos, tokens[:, pos], tokens[:, pos + 1]

    def hidden(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Final-norm hidden states of this rank's tokens and their labels."""
        pos, inp, labels = self.shard(tokens)
        cos, sin = rope_tables(pos, self.cfg.head_dim, self.cfg.rope_theta, self.dtype)
        x = F.embedding(inp, self.embed)
        for blk in self.blocks:
            x = checkpointing.run_block(blk.pre, blk.post, self.attend, x, cos, sin,
                                        self.checkpoint, self.seq_fraction)
        return rms_norm(x, self.norm, self.cfg.norm_eps), labels

    def loss(self, tokens: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy over the whole batch; backward leaves full gradients."""
        h, labels = self.hidden(tokens)
        if self.fused_head:
            local = head.fused_loss_sum(h, self.head, labels, *self.head_tiles)
        else:
            local = head.unfused_loss_sum(h, self.head, labels)
        local = local / (tokens.shape[0] * (tokens.shape[1] - 1))
        if self.group is None and self.dp_group is None:
            return local
        value = local.detach().clone()
        if self.group is not None:
            dist.all_reduce(value, group=self.group)
        if self.dp_group is not None:
            dist.all_reduce(value, group=self.dp_group)
            value /= self.dp
        return _SyncGrads.apply(local + (value - local).detach(), self)

    @torch.no_grad()
    def _reduce_grads(self, before: list[torch.Tensor | None]) -> None:
        """Sum this backward's gradients over the SP group, average them over DP (one flat buffer)."""
        params = [p for p in self.parameters() if p.grad is not None]
        olds = [b for p, b in zip(self.parameters(), before, strict=True) if p.grad is not None]
        if not params:
            return
        flat = torch.cat([(p.grad if b is None else p.grad - b).reshape(-1)
                          for p, b in zip(params, olds, strict=True)])
        if self.group is not None:
            dist.all_reduce(flat, group=self.group)
        if self.dp_group is not None:
            dist.all_reduce(flat, group=self.dp_group)
            flat /= self.dp
        offset = 0
        for p, b in zip(params, olds, strict=True):
            n = p.numel()
            delta = flat[offset:offset + n].view_as(p)
            p.grad = delta.clone() if b is None else b + delta
            offset += n
