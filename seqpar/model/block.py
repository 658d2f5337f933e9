"""One decoder layer of any family: its parameters (`rules.model.layer_shapes`), its RoPE and its
attention kind.

    norm -> Q/K/V (+ biases) -> QK-norm -> RoPE -> attention (+ sinks) -> O (+ bias) [-> norm]
         -> residual -> norm -> gated feed-forward (+ biases) or MoE [-> norm] -> residual

The bracketed norms are Gemma's sandwich norms; the norms are Gemma's (1 + w, in float32 at least)
where `norm_offset`. A layer's RoPE is `layer_rope(cfg, i)`: the model's, a sliding layer's own
base (Gemma 3), or none (no-RoPE layers); its attention is the model's for its window
(`Transformer`: one per distinct window, on one mesh). An MoE layer records its router's stats
into the model's `RouterLog` while a forward records (the load-balancing loss, `model.moe`);
under expert parallelism it holds its rank's rows of the experts and runs `model.ep`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from seqpar.model import checkpointing, deltanet, mla
from seqpar.model.ep import ExpertParallel, is_expert
from seqpar.model.layers import apply_rope, glu, norm
from seqpar.model.moe import RouterStats, moe_ffn
from seqpar.rules.model import ModelConfig, ffn_shapes, layer_shapes
from seqpar.rules.rope import Rope


def layer_rope(cfg: ModelConfig, layer: int) -> Rope | None:
    """The RoPE layer `layer` turns its queries and keys by (None: it does not)."""
    if layer in cfg.nope_layers:
        return None
    if cfg.layer_types[layer] == "sliding" and cfg.local_rope_theta:
        return Rope(theta=cfg.local_rope_theta, fraction=cfg.rope.fraction)
    return cfg.rope


class RouterLog:
    """The MoE layers' router stats of one forward, in layer order: a list while a forward
    records (`recording`), None otherwise, so that backward's recomputations add nothing."""

    def __init__(self) -> None:
        self.stats: list[RouterStats] | None = None
        self.load: dict[int, torch.Tensor] = {}  # layer -> pairs routed to each expert, summed

    def add_load(self, layer: int, counts: torch.Tensor) -> None:
        """Add one forward's per-expert assignments of MoE layer `layer` (every forward adds,
        recomputations too: a layer's counts scale alike, its imbalance does not move)."""
        self.load[layer] = self.load.get(layer, 0) + counts.detach()

    def loads(self) -> list[list[int]]:
        """Each MoE layer's summed per-expert assignments, in layer order (the metric
        `expert_imbalance`, `workers.metrics`)."""
        return [self.load[i].tolist() for i in sorted(self.load)]

    @contextlib.contextmanager
    def recording(self) -> Iterator[list[RouterStats]]:
        self.stats = []
        try:
            yield self.stats
        finally:
            self.stats = None


class Block(nn.Module):
    """Layer `layer` of `cfg` (see the module docstring).

    Parameters are stored in `stored` and used in `compute` (a cast per use when they differ, as
    autocast does: the gradient flows back to the stored dtype). With `mlp_tile` the norm and the
    feed-forward run over tiles of that many tokens, each recomputed in backward (ALST's tiled MLP:
    one tile's ffn-wide activations live at a time); the numbers are the same, every op being
    token-wise."""

    def __init__(self, cfg: ModelConfig, layer: int, stored: torch.dtype, compute: torch.dtype,
                 device: torch.device | None = None, mlp_tile: int | None = None,
                 router_log: RouterLog | None = None, experts: ExpertParallel | None = None):
        super().__init__()
        self.cfg, self.layer, self.compute, self.mlp_tile = cfg, layer, compute, mlp_tile
        self.rope = layer_rope(cfg, layer)
        self.moe = tuple(ffn_shapes(cfg, moe=True)) if cfg.is_moe(layer) else ()
        self.router_log = router_log
        self.experts = experts if self.moe else None  # EP: this rank's rows of the experts
        held = None if self.experts is None else self.experts.held(cfg.experts)
        for name, shape in layer_shapes(cfg, layer).items():
            if held is not None and is_expert(name):
                shape = (held[1] - held[0], *shape[1:])
            setattr(self, name, nn.Parameter(torch.empty(*shape, dtype=stored, device=device)))

    def w(self, p: torch.Tensor | None) -> torch.Tensor | None:
        return p if p is None or p.dtype == self.compute else p.to(self.compute)

    def opt(self, name: str) -> torch.Tensor | None:
        """Parameter `name` in the compute dtype, or None where this layer has none (a bias)."""
        return self.w(getattr(self, name, None))

    def norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return norm(x, self.w(getattr(self, name)), self.cfg.norm_eps, self.cfg.norm_offset)

    def pre(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        c, opt = self.cfg, self.opt
        b, s, _ = x.shape
        h = self.norm(x, "attn_norm")
        if c.mla:  # multi-head latent attention (DeepSeek): `model.mla`
            return mla.pre(h, opt, c, cos, sin)
        q = F.linear(h, *self.q_rows(0)).view(b, s, c.heads, c.head_dim)
        k = F.linear(h, opt("wk"), opt("bk")).view(b, s, c.kv_heads, c.head_dim)
        v = F.linear(h, opt("wv"), opt("bv")).view(b, s, c.kv_heads, c.head_dim)
        if c.qk_norm:  # per head over head_dim, before the rotation
            q, k = self.norm(q, "q_norm"), self.norm(k, "k_norm")
        if self.rope is None:
            return q, k, v
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def q_rows(self, part: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """wq's (and bq's) rows of the queries (part 0) or, with attn_gate, of the output gate
        (1): Qwen3-Next's q_proj holds each head's query, then its gate."""
        wq, bq, c = self.opt("wq"), self.opt("bq"), self.cfg
        if not c.attn_gate:
            return wq, bq
        w = wq.view(c.heads, 2, c.head_dim, -1)[:, part].reshape(c.heads * c.head_dim, -1)
        return w, None if bq is None else bq.view(c.heads, 2, c.head_dim)[:, part].reshape(-1)

    def ffn(self, h: torch.Tensor) -> torch.Tensor:
        """The dense gated feed-forward of normed h."""
        c, opt = self.cfg, self.opt
        gate, up = F.linear(h, opt("w1"), opt("b1")), F.linear(h, opt("w3"), opt("b3"))
        return F.linear(glu(gate, up, c.act, c.swiglu_limit), opt("w2"), opt("b2"))

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x, "ffn_norm")
        if self.moe:
            params = {name: self.opt(name) for name in self.moe}
            y, stats = (moe_ffn(h, params, self.cfg) if self.experts is None
                        else self.experts.ffn(h, params, self.cfg))
            if self.router_log is not None:
                self.router_log.add_load(self.layer, stats.counts)
                if self.router_log.stats is not None:
                    self.router_log.stats.append(stats)
        else:
            y = self.ffn(h)
        return self.norm(y, "post_ffn_norm") if self.cfg.sandwich_norms else y

    def post(self, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        a = a.reshape(x.shape[0], x.shape[1], -1)
        if self.cfg.attn_gate:  # the gate's rows again from x (token-wise: every mode's spans)
            a = a * torch.sigmoid(F.linear(self.norm(x, "attn_norm"), *self.q_rows(1)))
        o = F.linear(a, self.opt("wo"), self.opt("bo"))
        return self.residual_ffn(x + (self.norm(o, "post_attn_norm") if self.cfg.sandwich_norms
                                      else o))

    def residual_ffn(self, x: torch.Tensor) -> torch.Tensor:
        """x plus the feed-forward of x (over tiles of mlp_tile tokens where tiled)."""
        tile, s = self.mlp_tile, x.shape[1]
        if tile is None or s <= tile or not torch.is_grad_enabled():
            return x + self.mlp(x)
        # no RNG in the model: no RNG state kept per tile (5 KB each on the CPU)
        return x + torch.cat([checkpoint(self.mlp, x[:, t0:t0 + tile], use_reentrant=False,
                                         preserve_rng_state=False)
                              for t0 in range(0, s, tile)], dim=1)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend,
                mode: str, fraction: float) -> torch.Tensor:
        """The block under a checkpointing mode (one forward call: FSDP2 gathers around it); a
        linear layer's `attend` is its gated DeltaNet (`model.deltanet`)."""
        if self.cfg.layer_types[self.layer] == "linear":
            return deltanet.run_block(self, x, attend, mode)
        pre, attend = mla.bind(self, attend) if self.cfg.mla else (self.pre, attend)
        return checkpointing.run_block(pre, self.post, attend, x, cos, sin, mode, fraction,
                                       self.opt("sinks"))
