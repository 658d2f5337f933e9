"""A block's compute besides its attention, per class of alike layers (`rules.counts`): the GEMMs
at the cluster's rate for their shapes (`rates.gemm_rate`; a routed expert's GEMM runs the k/E of
the tokens the router sends it, so its smallest dimension is often those tokens), the token-wise
work at HBM bandwidth, and the LM head with its loss.

Element-wise bytes a token moves forward: ~10d (two norms, residuals) + 2(q + kv) (RoPE on q and
k, heads x head_dim wide) + 3 x the feed-forward's width (the gate), and where a family has them
the extra norms (Gemma's two, QK-norm) and an MoE layer's routing (its router's softmax and top-k,
each token's input sent to k experts and their outputs summed back).

A linear layer's mixer outside its projections (its convolution, norms, gates and chunked delta
rule) runs at its measured rate where the cluster has one (`linear_rate`: on a CPU host torch's
rule, small products and element-wise passes over chunk x chunk blocks, a few GFLOP/s of the rule's
FLOPs where a GEMM runs at ~100), else at the GEMM rate of a chunk's products (fla on a GPU).
"""

from __future__ import annotations

import math
from dataclasses import replace

from seqpar.planner.api import Prediction
from seqpar.planner.clusters import MEMORY_EFFICIENCY, Cluster
from seqpar.planner.rates import gemm_rate
from seqpar.rules.counts import ffn_width, gemms, layer_classes, mixer_widths, norm_width
from seqpar.rules.flops import head_flops, per_layer
from seqpar.rules.linear import CHUNK
from seqpar.rules.memory import ELEM
from seqpar.rules.model import ModelConfig


def stream_seconds(c: Cluster, nbytes: float) -> float:
    """Seconds to stream nbytes through device memory (a memory-bound kernel)."""
    if c.memory_gb_per_s:
        return nbytes / (MEMORY_EFFICIENCY * c.memory_gb_per_s * 1e9)
    if c.copy_gb_per_s:  # a measured host: copy_gb_per_s counts bytes written, 3 moved per write
        return nbytes / (3 * c.copy_gb_per_s * 1e9)
    return 0.0


def block_gemm_seconds(c: Cluster, cfg: ModelConfig, tokens: float, dtype: str,
                       mlp: bool = False, layer: int = 0, ep: int = 1, skew: float = 1.0) -> float:
    """Forward seconds of layer `layer`'s GEMMs (or its feed-forward's alone) for `tokens` tokens:
    each routed expert over its k/E share of them; under expert parallelism (`planner.ep`) a
    rank's E/ep experts over the k/E share of its EP group's ep x `tokens`, `skew` x that on the
    busiest rank."""
    total = 0.0
    for g in gemms(cfg, layer):
        if mlp and not g.mlp:
            continue
        copies, rows = g.copies, tokens
        if copies > 1:
            copies, rows = copies // ep, tokens * g.share * (ep * skew if ep > 1 else 1.0)
        total += copies * (2.0 * rows * g.rows * g.cols / gemm_rate(c, dtype, min(rows, g.rows,
                                                                                  g.cols)))
    return total


def elementwise_bytes(cfg: ModelConfig, tokens: float, e: int, layer: int = 0) -> float:
    """Bytes layer `layer`'s element-wise kernels move forward (the module docstring)."""
    q, kv = mixer_widths(cfg, layer)
    per = 10 * cfg.hidden + 2 * (q + kv) + 3 * ffn_width(cfg, layer) + norm_width(cfg)
    if cfg.is_moe(layer):
        per += 2 * cfg.experts + 4 * cfg.experts_per_tok * cfg.hidden
    return tokens * per * e


def class_seconds(c: Cluster, cfg: ModelConfig, dtype: str, tokens: float, world: int,
                  layer: int, ep: int = 1, skew: float = 1.0) -> tuple[float, float, float]:
    """(GEMMs, the feed-forward's GEMMs, element-wise work) of layer `layer`, forward seconds of
    `tokens` tokens on one of `world` ranks (CPU ranks share a host's cores; `ep`, `skew`:
    `block_gemm_seconds`)."""

    def host(seconds: float) -> float:
        return c.host_seconds(seconds, seconds * world, world)

    return (host(block_gemm_seconds(c, cfg, tokens, dtype, layer=layer, ep=ep, skew=skew)),
            host(block_gemm_seconds(c, cfg, tokens, dtype, mlp=True, layer=layer, ep=ep,
                                    skew=skew)),
            host(stream_seconds(c, elementwise_bytes(cfg, tokens, ELEM[dtype], layer))))


def head_seconds(c: Cluster, cfg: ModelConfig, dtype: str, tokens: float, world: int) -> float:
    """Forward + backward seconds of the LM head and loss for `tokens` tokens: 3 x its GEMM and
    the logits' fp32 passes."""
    seconds = (3 * head_flops(cfg, tokens) / gemm_rate(c, dtype, min(tokens, cfg.hidden))
               + stream_seconds(c, 4 * tokens * cfg.vocab * 4))
    return c.host_seconds(seconds, seconds * world, world)


def layer_seconds(c: Cluster, cfg: ModelConfig, dtype: str, tokens: float,
                  world: int = 1) -> tuple[float, float, float, float]:
    """(a block's GEMMs, its feed-forward's GEMMs, its element-wise work, the head and loss),
    forward seconds of `tokens` tokens on one of `world` ranks; a model whose layers differ: the
    mean block over its layers."""
    each = {cl.first: class_seconds(c, cfg, dtype, tokens, world, cl.first)
            for cl in layer_classes(cfg)}
    g, mlp, ew = (per_layer(cfg, lambda cl, i=i: each[cl.first][i]) for i in range(3))
    return g, mlp, ew, head_seconds(c, cfg, dtype, tokens, world)


def linear_rate(c: Cluster, dtype: str, dim: int) -> float:
    """FLOP/s of a linear layer's mixer outside its projections (forward + backward, over the
    rule's FLOPs as `rules.linear` counts them) at head dim `dim`: the cluster's measured table
    (`linear_tflops_by_dim`, by `seqpar calibrate`), interpolated in log dim and held at its ends;
    else the GEMM rate of a chunk's products."""
    table = c.linear_tflops_by_dim
    if not table:
        return gemm_rate(c, dtype, CHUNK)
    dims = sorted(table)
    lo = max((d for d in dims if d <= dim), default=dims[0])
    hi = min((d for d in dims if d >= dim), default=dims[-1])
    if lo == hi:
        return table[lo] * 1e12
    f = (math.log(dim) - math.log(lo)) / (math.log(hi) - math.log(lo))
    return (table[lo] + f * (table[hi] - table[lo])) * 1e12


def linear_at_rate(c: Cluster, cfg: ModelConfig, dtype: str, p: Prediction) -> Prediction:
    """A linear layer's prediction (`Setup.linear`: its rule at the GEMM rate of a chunk) with the
    rule at `linear_rate` instead; its communication as it was."""
    extra = p.compute_ms * (gemm_rate(c, dtype, CHUNK) / linear_rate(c, dtype, cfg.lin_k_dim) - 1)
    if extra == 0.0:
        return p
    return replace(p, attention_ms=p.attention_ms + extra, forward_ms=p.forward_ms + extra / 3,
                   compute_ms=p.compute_ms + extra)
