"""Qwen3-Next's gated DeltaNet layer, as transformers' Qwen3NextGatedDeltaNet computes it, on one
process or under LASP (`algorithms.lasp`: this rank's stretch of the sequence).

    mixer = DeltaNet(Lasp(comm, "lasp2"))           # or DeltaNet() on one process
    out = mixer(h, p, cfg, cu_seqlens=None)         # h (b, s, d) normed; p: the layer's lin_* params
    layers = mixers(cfg, attentions, layout, mask, linear_sp="lasp2")   # a model's, `build_layers`

    q, k, v, z, b, a = split(W_qkvz h, W_ba h)      # grouped by key head, as the checkpoint stores them
    q, k, v = silu(short causal depthwise conv([q k v]))   # inside each document; the rank's first
                                                    # kernel-1 inputs reach back to the previous rank
    g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b)
    o = gated delta rule(l2norm(q), l2norm(k), v, g, beta) with the state reset at each document
    out = W_out (rmsnorm(o) w * silu(z))            # per value head

The rule runs in float32 at least and in float64 for float64 models (transformers rounds it to
float32 there; the float64 path is seqpar's reference).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from seqpar.algorithms import Attention, ledger
from seqpar.algorithms.comm import Comm
from seqpar.algorithms.delta_rule import resolve
from seqpar.algorithms.lasp import Lasp, Stretch
from seqpar.errors import require
from seqpar.rules.linear import check_lasp
from seqpar.rules.model import ModelConfig

L2_EPS = 1e-6  # transformers' (and fla's) l2norm of q and k
LINEAR = ("lin_qkvz", "lin_ba", "lin_conv", "lin_dt_bias", "lin_a_log", "lin_norm", "lin_out")
OPTIONS = ("linear_sp", "linear_backend")  # a model's linear layers' options (`mixers`)

Tensor = torch.Tensor


def split(qkvz: Tensor, ba: Tensor, cfg: ModelConfig) -> tuple[Tensor, ...]:
    """q, k (b, s, Hk, dk), v, z (b, s, Hv, dv), b, a (b, s, Hv) from the two projections, whose
    rows come key head by key head: [q k v z] and [b a] of each head's group of value heads."""
    bs = qkvz.shape[:2]
    hk, dk, dv = cfg.lin_k_heads, cfg.lin_k_dim, cfg.lin_v_dim
    r = cfg.lin_v_heads // hk
    q, k, v, z = qkvz.view(*bs, hk, 2 * dk + 2 * r * dv).split([dk, dk, r * dv, r * dv], dim=-1)
    b, a = ba.view(*bs, hk, 2 * r).split([r, r], dim=-1)
    heads = (*bs, cfg.lin_v_heads)
    return (q, k, v.reshape(*heads, dv), z.reshape(*heads, dv), b.reshape(heads),
            a.reshape(heads))


def short_conv(x: Tensor, halo: Tensor, weight: Tensor, st: Stretch) -> Tensor:
    """silu of the causal depthwise convolution of x (b, s, c) by weight (c, 1, K), halo (b, K-1, c)
    the inputs before x's first row; a token sees no input before its document's start."""
    kernel, s = weight.shape[-1], x.shape[1]
    ext = torch.cat([halo, x], dim=1)
    w = weight[:, 0, :]
    if not _crosses(st, kernel):  # no document starts within reach: the plain convolution
        out = F.conv1d(ext.transpose(1, 2), weight, groups=weight.shape[0]).transpose(1, 2)
        return F.silu(out)
    pos = torch.arange(st.lo, st.hi, device=x.device)
    start = st.doc_start(x.device)
    out = x.new_zeros(x.shape)
    for j in range(kernel):  # input t - j, kept inside the token's document
        keep = (pos - j >= start).to(x.dtype)[None, :, None]
        out = out + ext[:, kernel - 1 - j:kernel - 1 - j + s] * w[:, kernel - 1 - j] * keep
    return F.silu(out)


def _crosses(st: Stretch, kernel: int) -> bool:
    """Whether a document starts where some token's convolution would reach across it."""
    starts = [st.lo + t for t in st.starts] + ([st.first] if st.first > 0 else [])
    return any(c > 0 and c + kernel - 2 >= st.lo and c < st.hi for c in starts)


def l2norm(x: Tensor) -> Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2_EPS)


def gated_norm(o: Tensor, z: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm of o over a value head, times weight, times silu(z) (norm before gate), in float32
    at least."""
    acc = torch.promote_types(o.dtype, torch.float32)
    y = o.to(acc)
    y = (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps)).to(o.dtype)
    return ((weight * y) * F.silu(z.to(acc))).to(o.dtype)


class DeltaNet:
    """The layer's computation on this rank's tokens (see the module docstring): its SP is `lasp`
    (None: one process). In a model, `dealer` is the attention on the same mesh that deals the
    tokens (`positions`), so a linear layer can stand first among the model's layers."""

    def __init__(self, lasp: Lasp | None = None, dealer: Attention | None = None):
        self.lasp = lasp if lasp is not None else Lasp(Comm.solo())
        self.dealer = dealer

    @property
    def mesh(self):
        return self.dealer.mesh

    def positions(self, n: int, cu_seqlens: Any = None, mask: Any = None) -> Tensor:
        return self.dealer.positions(n, cu_seqlens, mask)

    def __call__(self, h: Tensor, p: Mapping[str, Tensor], cfg: ModelConfig,
                 cu_seqlens: Any = None) -> Tensor:
        lasp = self.lasp
        kernel = cfg.conv_kernel
        st = lasp.stretch(h.shape[1], cu_seqlens)
        q, k, v, z, b, a = split(F.linear(h, p["lin_qkvz"]), F.linear(h, p["lin_ba"]), cfg)
        bs = h.shape[:2]
        x = torch.cat([q.reshape(*bs, -1), k.reshape(*bs, -1), v.reshape(*bs, -1)], dim=-1)
        x = short_conv(x, lasp.halo(x, kernel - 1, st), p["lin_conv"], st)
        kd, vd = cfg.lin_k_heads * cfg.lin_k_dim, cfg.lin_v_heads * cfg.lin_v_dim
        q, k, v = x.split([kd, kd, vd], dim=-1)
        acc = torch.promote_types(h.dtype, torch.float32)
        r = cfg.lin_v_heads // cfg.lin_k_heads  # each key head serves r value heads in a row
        q, k = (l2norm(t.reshape(*bs, cfg.lin_k_heads, cfg.lin_k_dim).to(acc))
                .repeat_interleave(r, dim=2) for t in (q, k))
        if resolve(lasp.backend, h.device, h.dtype) == "fla":
            q, k = q.to(h.dtype), k.to(h.dtype)
        v = v.reshape(*bs, cfg.lin_v_heads, cfg.lin_v_dim)
        g = -p["lin_a_log"].to(acc).exp() * F.softplus(a.to(acc) + p["lin_dt_bias"].to(acc))
        o = lasp.delta_rule(q, k, v, g, b.sigmoid(), cfg.lin_k_dim ** -0.5, st)
        o = gated_norm(o, z, p["lin_norm"], cfg.norm_eps)
        return F.linear(o.reshape(*bs, -1), p["lin_out"])


def mixers(cfg: ModelConfig, layers: Sequence[Attention], layout: str, mask: Any = None,
           linear_sp: str | None = None, linear_backend: str = "auto") -> tuple:
    """`layers` (each layer's attention) with each linear layer's replaced by a DeltaNet under
    LASP (`linear_sp`, default lasp2) on the first attention's SP group."""
    dealer = layers[0]
    comm = dealer.mesh.comm("sp")
    mode = check_lasp(cfg, layout, comm.size, linear_sp)
    if mode is None:
        return tuple(layers)
    require(mask is None, "mask", "given", "must be None for a model with linear-attention "
            "layers (their state runs causally within each document: pass cu_seqlens)")
    mixer = DeltaNet(Lasp(comm, mode, linear_backend), dealer)
    return tuple(mixer if kind == "linear" else a
                 for kind, a in zip(cfg.layer_types, layers, strict=True))


def run_block(blk: Any, x: Tensor, mixer: Any, mode: str) -> Tensor:
    """A linear layer's block (`Block`): x + mixer(norm(x)), then the feed-forward's residual.
    Under checkpoint 'full' it is recomputed in backward (LASP's communication again, booked as
    forward); the other modes split softmax attention and keep a linear layer's activations."""

    def body(x: Tensor) -> Tensor:
        y = mixer(blk.norm(x, "attn_norm"), {n: blk.opt(n) for n in LINEAR}, blk.cfg)
        return blk.residual_ffn(x + (blk.norm(y, "post_attn_norm") if blk.cfg.sandwich_norms
                                     else y))

    if mode != "full" or not torch.is_grad_enabled():
        return body(x)
    saved = ledger.active()
    return checkpoint(body, x, use_reentrant=False, preserve_rng_state=False,
                      context_fn=lambda: (contextlib.nullcontext(), ledger.replay_of(saved)))
