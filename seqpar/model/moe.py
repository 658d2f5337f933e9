"""A mixture-of-experts feed-forward (Mixtral, Qwen3-MoE, gpt-oss, DeepSeek-V3) and its
load-balancing loss.

    out, stats = moe_ffn(x, p, cfg)          # x (b, s, d); p: ffn_shapes(cfg, moe=True) by name
    aux = aux_loss([stats, ...], cfg, group)  # the whole sequence's, on every rank of `group`

Routing is the family's (`cfg.router`); each expert runs on the tokens routed to it only, so a
token's forward costs 2 (k * 3 f d + E d) FLOPs (k experts' three matmuls and the router), plus
2 * 3 s d with shared experts. Token-wise: a rank's shard goes through unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.nn.functional import all_reduce as _autograd_all_reduce

from seqpar.model.layers import glu
from seqpar.rules.model import ModelConfig

Tensor = torch.Tensor


@dataclass(frozen=True)
class Routing:
    """Each token's experts and weights, and the softmax over all experts the aux loss reads."""

    experts: Tensor  # (n, k) int64: the chosen experts
    weights: Tensor  # (n, k) their weights, in router_dtype
    probs: Tensor    # (n, E) softmax over every expert's logit, in router_dtype


@dataclass(frozen=True)
class RouterStats:
    """One MoE layer's routing over this rank's tokens: the sums the load-balancing loss needs,
    which add over ranks (and layers), so a sequence split over ranks sums to the whole's."""

    counts: Tensor    # (E,) int64: assignments per expert (a token sent to k experts counts k times)
    prob_sum: Tensor  # (E,) router probabilities summed over tokens (grad only with aux_loss_coef)
    tokens: Tensor    # () int64: the tokens counted


def router_dtype(dtype: torch.dtype) -> torch.dtype:
    """The router's softmax runs in float32 at least (as transformers' does), in float64 for
    float64 models (transformers rounds to float32 there; the float64 path is seqpar's reference)."""
    return torch.promote_types(dtype, torch.float32)


def route(x: Tensor, p: Mapping[str, Tensor], cfg: ModelConfig) -> Routing:
    """Route tokens x (n, d): softmax_topk (Mixtral, Qwen3-MoE): softmax over every expert, the k
    largest, renormalised to sum 1 when norm_topk, times routed_scale (DeepSeek-V2's greedy);
    topk_softmax (gpt-oss): the k largest logits, softmax over those k; sigmoid_group
    (DeepSeek-V3): `group_topk`."""
    logits = F.linear(x, p["router"], p.get("router_bias"))
    dtype = router_dtype(logits.dtype)
    probs = torch.softmax(logits, dim=-1, dtype=dtype)
    k = cfg.experts_per_tok
    if cfg.router == "sigmoid_group":
        experts, weights = group_topk(logits.to(dtype), p["router_score_bias"], cfg)
        return Routing(experts, weights, probs)
    if cfg.router == "topk_softmax":
        top, experts = torch.topk(logits, k, dim=-1)
        weights = torch.softmax(top, dim=-1, dtype=dtype)
    else:
        weights, experts = torch.topk(probs, k, dim=-1)
        if cfg.norm_topk:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        if cfg.routed_scale != 1.0:  # DeepSeek-V2's routed_scaling_factor
            weights = weights * cfg.routed_scale
    return Routing(experts, weights, probs)


def group_topk(logits: Tensor, score_bias: Tensor, cfg: ModelConfig) -> tuple[Tensor, Tensor]:
    """DeepSeek-V3's routing (noaux_tc): sigmoid scores; the experts chosen by score + score_bias
    (its e_score_correction_bias: it picks, it never weighs) among the topk_group of n_group
    groups whose two best biased scores sum highest; their unbiased scores as weights,
    renormalised where norm_topk (+1e-20, as the reference), times routed_scale. (experts (n, k),
    weights (n, k))."""
    scores = torch.sigmoid(logits)
    n, e = scores.shape
    per = e // cfg.n_group
    choice = scores.detach() + score_bias.detach().to(scores.dtype)
    best = choice.view(n, cfg.n_group, per).topk(min(2, per), dim=-1).values.sum(dim=-1)
    kept = torch.topk(best, cfg.topk_group, dim=-1, sorted=False).indices
    allowed = torch.zeros_like(best, dtype=torch.bool).scatter_(1, kept, True)
    choice = choice.masked_fill(~allowed.repeat_interleave(per, dim=1), float("-inf"))
    experts = torch.topk(choice, cfg.experts_per_tok, dim=-1, sorted=False).indices
    weights = scores.gather(1, experts)
    if cfg.norm_topk:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return experts, weights * cfg.routed_scale


def run_experts(xs: Tensor, counts: Sequence[int], p: Mapping[str, Tensor],
                cfg: ModelConfig) -> Tensor:
    """Experts on tokens grouped by expert: rows [sum(counts[:e]), sum(counts[:e+1])) of xs (m, d)
    go through expert e of p's stacked experts_* tensors (expert parallelism passes its own
    experts' slice and the tokens it received). An expert with no tokens costs nothing."""
    # unbind, not indexing: one backward node stacks every expert's gradient once, where E
    # indexings would each write a zero-filled gradient of the whole stack
    w1, w3, w2 = (p[f"experts_{n}"].unbind(0) for n in ("w1", "w3", "w2"))
    biases = ([p[f"experts_{n}"].unbind(0) for n in ("b1", "b3", "b2")] if cfg.expert_bias
              else [[None] * len(counts)] * 3)
    pieces, start = [], 0
    for e, count in enumerate(counts):
        if not count:
            continue
        rows = xs[start:start + count]
        h = glu(F.linear(rows, w1[e], biases[0][e]), F.linear(rows, w3[e], biases[1][e]),
                cfg.act, cfg.swiglu_limit)
        pieces.append(F.linear(h, w2[e], biases[2][e]))
        start += count
    if not pieces:  # no tokens at all: an empty pass keeps every expert in the graph (zero grads)
        h = glu(F.linear(xs, w1[0], biases[0][0]), F.linear(xs, w3[0], biases[1][0]),
                cfg.act, cfg.swiglu_limit)
        return F.linear(h, w2[0], biases[2][0])
    return torch.cat(pieces)


def shared_ffn(x: Tensor, p: Mapping[str, Tensor], cfg: ModelConfig) -> Tensor:
    """The shared experts: one gated feed-forward every token goes through; with shared_gate
    (Qwen3-Next) scaled by sigmoid(shared_gate x), a scalar a token."""
    h = glu(F.linear(x, p["shared_w1"]), F.linear(x, p["shared_w3"]), cfg.act, cfg.swiglu_limit)
    y = F.linear(h, p["shared_w2"])
    return torch.sigmoid(F.linear(x, p["shared_gate"])) * y if cfg.shared_gate else y


def moe_ffn(x: Tensor, p: Mapping[str, Tensor], cfg: ModelConfig, mask: Tensor | None = None,
            run: Callable[[Tensor, Tensor], Tensor] | None = None) -> tuple[Tensor, RouterStats]:
    """The MoE feed-forward of x (b, s, d) and its router's stats over the tokens `mask` (b, s)
    keeps (None: all; a padding token is computed but not counted, as transformers' attention_mask
    leaves it out of the loss). `run(rows, per_expert)`: the experts' outputs of the assignments'
    rows grouped by expert (default `run_experts` here; expert parallelism's exchange,
    `model.ep`)."""
    b, s, d = x.shape
    flat = x.reshape(b * s, d)
    r = route(flat, p, cfg)
    k = cfg.experts_per_tok
    chosen = r.experts.reshape(-1)                       # (n k,): assignment i is token i // k
    order = chosen.argsort(stable=True)                  # assignments grouped by expert
    per_expert = torch.bincount(chosen, minlength=cfg.experts)
    rows = flat[order // k]
    ys = run(rows, per_expert) if run else run_experts(rows, per_expert.tolist(), p, cfg)
    # back to token order, then each token's k outputs weighted and summed (no scatter-add: the
    # sum's order is fixed, so a shard's tokens add exactly as the whole sequence's do)
    ys = torch.zeros_like(ys).index_copy(0, order, ys).view(b * s, k, d)
    out = (ys * r.weights.to(ys.dtype).unsqueeze(-1)).sum(dim=1)
    if cfg.shared_ffn:
        out = out + shared_ffn(flat, p, cfg)
    return out.view(b, s, d), router_stats(r, per_expert, mask, cfg)


def router_stats(r: Routing, per_expert: Tensor, mask: Tensor | None,
                 cfg: ModelConfig) -> RouterStats:
    """The layer's RouterStats of routing r over the tokens `mask` keeps (None: all)."""
    with torch.set_grad_enabled(torch.is_grad_enabled() and cfg.aux_loss_coef > 0):
        if mask is None:
            return RouterStats(per_expert, r.probs.sum(dim=0),
                               torch.tensor(r.probs.shape[0], device=per_expert.device))
        keep = mask.reshape(-1).to(torch.bool)
        counts = torch.bincount(r.experts[keep].reshape(-1), minlength=cfg.experts)
        return RouterStats(counts, r.probs[keep].sum(dim=0), keep.sum())


def aux_loss(stats: Sequence[RouterStats], cfg: ModelConfig,
             group: dist.ProcessGroup | None = None) -> Tensor:
    """transformers' load_balancing_loss_func over every MoE layer's tokens, concatenated:
    E * sum_e (assignments_e / rows) * (probability_e / rows), rows = tokens x layers. Under SP
    the sums are all-reduced over `group` first, so every rank gets the whole sequence's value;
    the all-reduce's backward sums the ranks' gradients, so every rank must add the result to its
    loss (aux / world each, for the sum of the ranks' shares to hold it once)."""
    if not stats:
        return torch.zeros(())
    e = cfg.experts
    dtype = stats[0].prob_sum.dtype
    # one collective: counts, probabilities and tokens in float64 (counts of long sequences times
    # layers pass 2^24, where float32 stops counting exactly)
    packed = torch.cat([sum(s.counts for s in stats).double(),
                        sum(s.prob_sum for s in stats).double(),
                        sum(s.tokens for s in stats).double().reshape(1)])
    if group is not None and dist.get_world_size(group) > 1:
        packed = _autograd_all_reduce(packed, group=group)
    rows = packed[2 * e].clamp(min=1.0)  # no token anywhere: 0, not 0 / 0
    loss = e * ((packed[:e] / rows) * (packed[e:2 * e] / rows)).sum()
    return loss.to(dtype)
