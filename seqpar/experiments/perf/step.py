"""--scope model: a whole training step of a decoder (seqpar.model.config.ModelConfig).

Per layer and rank (s = N/P tokens): the attention layer's forward + backward from its schedule, and
the rest of the layer as GEMMs (Megatron-style counting, SwiGLU and GQA projections):
    2·s·h·(h + 2·kv_dim) (q, k, v) + 2·s·h² (o) + 6·s·h·ffn (SwiGLU), backward twice that,
plus the LM head 2·s·h·V (x3) once. Norms and element-wise work are memory-bound and left out.
Recompute by checkpoint policy: full recomputes the layer's forward (attention included), sc++ the
GEMMs only (LoongTrain SC++ keeps the attention output), seq:f a fraction f of both.
MFU = model FLOPs (without recompute) / (step time x P x peak).
"""

from __future__ import annotations

from dataclasses import replace

from seqpar.algorithms.base import AttnShape
from seqpar.experiments.clusters import Cluster
from seqpar.experiments.perf import memory
from seqpar.experiments.perf.api import Prediction
from seqpar.model.config import ModelConfig

CHECKPOINTS = ("none", "full", "sc++", "seq:0.5")


def gemm_flops(cfg: ModelConfig, tokens: int) -> float:
    """Forward FLOPs of one layer's GEMMs for `tokens` tokens."""
    h, kv = cfg.hidden, cfg.kv_heads * cfg.head_dim
    return 2.0 * tokens * (h * (h + 2 * kv) + h * h + 3 * h * cfg.ffn)


def shape_of(cfg: ModelConfig, seq_len: int, batch: int = 1, elem_bytes: int = 2) -> AttnShape:
    return AttnShape(batch, seq_len, cfg.heads, cfg.kv_heads, cfg.head_dim, elem_bytes)


def step(p: Prediction, cfg: ModelConfig, cluster: Cluster, shape: AttnShape, world: int,
         checkpoint: str = "full", dtype: str = "bfloat16") -> Prediction:
    """The attention-scope prediction `p` extended to a training step with `checkpoint`."""
    tokens = shape.batch * shape.seq_len // world
    gemm_rate = cluster.rate(dtype, "gemm")
    g_fwd = gemm_flops(cfg, tokens) / gemm_rate
    head = 3 * 2.0 * tokens * cfg.hidden * cfg.vocab / gemm_rate
    attn_fwd, attn = p.forward_ms / 1e3, p.attention_ms / 1e3
    f = memory.policy_fraction(checkpoint)
    recompute = {"none": 0.0, "full": g_fwd + attn_fwd, "sc++": g_fwd}.get(
        checkpoint, f * (g_fwd + attn_fwd))
    seconds = cfg.layers * (3 * g_fwd + attn + recompute) + head
    model_flops = (cfg.layers * 3 * gemm_flops(cfg, tokens) + 3 * 2.0 * tokens * cfg.hidden * cfg.vocab
                   + cfg.layers * attention_flops_per_rank(shape, world))
    peak = memory.step_peak(p.algorithm, shape, world, p.options, cfg, checkpoint,
                            p.peak_mem_bytes, dtype)
    return replace(p, step_ms=1e3 * seconds, mfu=model_flops / (seconds * cluster.peak(dtype)),
                   peak_mem_bytes=peak, fits=peak <= cluster.memory_gb * 1e9)


def attention_flops_per_rank(shape: AttnShape, world: int) -> float:
    """Causal attention forward + backward FLOPs per rank (the papers' 3.5 x forward)."""
    from seqpar.algorithms.kernels import attention_flops

    return 3.5 * attention_flops(shape.batch, shape.seq_len, shape.seq_len, shape.heads,
                                 shape.head_dim, "causal") / world
