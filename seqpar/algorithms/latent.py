"""Multi-head latent attention's keys and values (DeepSeek-V2/V3, Kimi K2): rebuilt per head from
a token's latent, the one place this up-projection lives (the model's MLA layer and the latent
ring both call it).

A token keeps `latent` = [c, k_rope] (bshd, one head): c the normed kv_lora_rank latent, k_rope
the qk_rope_dim RoPE key every head shares. `wkv_b` (heads * (nope + v_dim), kv_lora_rank) turns c
into each head's [k_nope, v]; a head's key is [k_nope, k_rope], its value v (as transformers'
`DeepseekV3Attention.expand_kv`).

With mla_pass latent a ring-family attention (`LatentAttention`) carries the latent — kv_lora_rank
+ qk_rope_dim values a token, 576 for DeepSeek-V3 against K,V's 128 x 320 — and rebuilds each
arriving block's K,V (`UpProjection`: one up-projection a ring step, again in backward, where
the latent's gradient travels home in place of dK,dV and wkv_b's stays on the rank). Bytes:
each algorithm's `latent_bytes` (rules).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from seqpar.algorithms import ledger
from seqpar.algorithms.base import Algorithm, Attention, Geometry, algorithm_backward
from seqpar.errors import require
from seqpar.rules import masks
from seqpar.rules.shape import AttnShape


def latent_width(wkv_b: torch.Tensor) -> int:
    """kv_lora_rank: the latent's own values (the rest of a latent row is the RoPE key)."""
    return wkv_b.shape[1]


def up_project(latent: torch.Tensor, wkv_b: torch.Tensor, heads: int, v_dim: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """(K (B, s, H, nope + rope), V (B, s, H, v_dim)) of tokens' latents (B, s, 1, r + rope)."""
    b, s = latent.shape[:2]
    r = latent_width(wkv_b)
    c, k_rope = latent.split((r, latent.shape[-1] - r), dim=-1)
    kv = F.linear(c.reshape(b, s, r), wkv_b).view(b, s, heads, -1)
    k_nope, v = kv.split((kv.shape[-1] - v_dim, v_dim), dim=-1)
    k = torch.cat([k_nope, k_rope.expand(b, s, heads, k_rope.shape[-1])], dim=-1)
    return k, v.contiguous()


def up_project_backward(latent: torch.Tensor, wkv_b: torch.Tensor, dk: torch.Tensor,
                        dv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(d latent, d wkv_b) of `up_project` given dK and dV, in their (accumulation) dtype: each
    head's [dk_nope, dv] back through wkv_b, the shared RoPE key's gradient summed over heads."""
    b, s, heads, _ = dv.shape
    r = latent_width(wkv_b)
    rope = latent.shape[-1] - r
    work = dk.dtype
    dkv = torch.cat([dk[..., :dk.shape[-1] - rope], dv], dim=-1).reshape(b * s, -1)
    c = latent[..., :r].reshape(b * s, r).to(work)
    dc = dkv @ wkv_b.to(work)
    d_rope = dk[..., dk.shape[-1] - rope:].sum(dim=2, keepdim=True)
    return torch.cat([dc.view(b, s, 1, r), d_rope], dim=-1), dkv.t() @ c


class UpProjection:
    """K,V of latent blocks for queries q of one head shard (member `member` of `ways`: its rows of
    wkv_b; the whole when ways = 1), and backward through it, with this rank's part of wkv_b's
    gradient summed over every block it rebuilt (`dw`, the whole matrix's shape; the model sums it
    over the group once, as every weight's)."""

    def __init__(self, q: torch.Tensor, latent: torch.Tensor, wkv_b: torch.Tensor,
                 member: int = 0, ways: int = 1):
        self.heads = q.shape[2]
        per = wkv_b.shape[0] // (self.heads * ways)  # a head's nope + v_dim rows
        nope = q.shape[-1] - (latent.shape[-1] - latent_width(wkv_b))
        self.v_dim = per - nope
        self.rows = slice(member * self.heads * per, (member + 1) * self.heads * per)
        self.w, self.full = wkv_b[self.rows], wkv_b.shape
        self._dw: torch.Tensor | None = None

    def kv(self, latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return up_project(latent, self.w, self.heads, self.v_dim)

    def backward(self, latent: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor) -> torch.Tensor:
        """d latent of one block; its part of d wkv_b added to `dw`."""
        dlatent, dw = up_project_backward(latent, self.w, dk, dv)
        self._dw = dw if self._dw is None else self._dw.add_(dw)
        return dlatent

    @property
    def dw(self) -> torch.Tensor:
        """This rank's part of d wkv_b (zero outside its head shard's rows)."""
        dtype = self.w.dtype if self._dw is None else self._dw.dtype
        out = torch.zeros(self.full, dtype=dtype, device=self.w.device)
        if self._dw is not None:
            out[self.rows] = self._dw
        return out


class _LatentCall:
    """What `base.algorithm_backward` calls back on: the algorithm's latent backward."""

    def __init__(self, algo: Algorithm):
        self.algo = algo

    def backward(self, dout: torch.Tensor, saved: tuple[torch.Tensor, ...], state: Any):
        return self.algo.latent_backward(dout, saved, state)


class _LatentShell(torch.autograd.Function):
    """`base._Shell` for a call that carries the latent: inputs q, the latent and wkv_b (and the
    sinks), gradients dq, d latent, this rank's part of d wkv_b (and dsinks)."""

    @staticmethod
    def forward(ctx, algo: Algorithm, q, latent, wkv_b, sinks):
        out, saved, state = algo.latent_forward(q, latent, wkv_b)
        ctx.algo, ctx.state, ctx.ledgers = _LatentCall(algo), state, ledger.active()
        ctx.dtypes = (q.dtype, latent.dtype, wkv_b.dtype, None if sinks is None else sinks.dtype)
        ctx.save_for_backward(*saved)
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, dout):
        return (None, *algorithm_backward(ctx, dout))


class LatentAttention(Attention):
    """A built ring-family attention called with MLA's latent (mla_pass latent): q, the normed
    latent c and the turned RoPE key k_rope of this rank's tokens, and wkv_b; the latent travels
    where K,V did and each block's K,V are rebuilt on arrival (`UpProjection`). out as the
    attention over `up_project`'s K,V; wkv_b's gradient is this rank's part (sum it over the group,
    as every weight's)."""

    def __init__(self, attention: Attention):
        algo = attention.algo
        require(type(algo).latent_pass, "mla_pass", "latent",
                "carries the latent on a ring: ring, double_ring, usp, burst or wallfacer, not "
                f"{algo.name} (ulysses and allgather move K,V heads after the up-projection: "
                "mla_pass kv)")
        super().__init__(algo)

    def __call__(self, q: torch.Tensor, c: torch.Tensor, k_rope: torch.Tensor, *,
                 wkv_b: torch.Tensor, cu_seqlens: torch.Tensor | Sequence[int] | None = None,
                 mask: masks.Mask | None = None,
                 sinks: torch.Tensor | None = None) -> torch.Tensor:
        latent = torch.cat([c, k_rope], dim=-1)
        shape = latent_shape(q, latent, wkv_b, self.algo.world)
        return self.run(shape, (q, latent),
                        lambda a, *ts: _LatentShell.apply(a, *ts, wkv_b, sinks), cu_seqlens,
                        mask, sinks)

    def latent_bytes(self, shape: AttnShape, width: int, cu_seqlens: Sequence[int] | None = None,
                     mask: masks.Mask | None = None) -> dict[str, int]:
        """The most bytes any rank sends per call on `shape` carrying a latent of `width` values a
        token (kv_lora_rank + qk_rope_dim), net of the transfers skipped under the mask."""
        a = self.algo
        mask = mask if mask is not None else a.mask
        geometry = Geometry.of(shape, a.world, a.layout, a.causal, cu_seqlens, a.window, mask)
        per_rank = [type(a).latent_bytes(shape, a.world, a.options, r, width, geometry)
                    for r in range(a.world)]
        return {p: max(b[p] for b in per_rank) for p in ledger.PHASES}


def latent_shape(q: torch.Tensor, latent: torch.Tensor, wkv_b: torch.Tensor,
                 world: int) -> AttnShape:
    """The global shape of a latent call (every head reads K,V: kv_heads = heads), its shards
    checked: q (B, s, H, nope + rope), the latent (B, s, 1, r + rope), wkv_b (H (nope + v), r)."""
    require(q.dim() == 4 and latent.dim() == 4 and latent.shape[:3] == (*q.shape[:2], 1),
            "latent.shape", tuple(latent.shape),
            f"must be (batch, seq, 1, kv_lora_rank + qk_rope_dim) beside q {tuple(q.shape)}")
    r = latent_width(wkv_b)
    nope = q.shape[-1] - (latent.shape[-1] - r)
    per, heads = wkv_b.shape[0] // q.shape[2], q.shape[2]
    require(wkv_b.dim() == 2 and 0 < nope < per and wkv_b.shape[0] == heads * per,
            "wkv_b.shape", tuple(wkv_b.shape),
            f"must be (heads x (qk_nope + v_head_dim), kv_lora_rank) for q {tuple(q.shape)} and a "
            f"latent of {latent.shape[-1]} values")
    require(q.dtype == latent.dtype == wkv_b.dtype, "latent.dtype", str(latent.dtype),
            f"q, the latent and wkv_b must share one dtype (q is {q.dtype})")
    return AttnShape(q.shape[0], q.shape[1] * world, heads, heads, q.shape[-1],
                     q.element_size(), per - nope)
