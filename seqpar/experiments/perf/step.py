"""--scope model: a whole training step of a decoder (seqpar.model.config.ModelConfig).

Per layer and rank (s = N/P tokens): the attention layer's forward + backward from its schedule, and
the rest of the layer as GEMMs (Megatron-style counting, SwiGLU and GQA projections):
    2·s·h·(h + 2·kv_dim) (q, k, v) + 2·s·h² (o) + 6·s·h·ffn (SwiGLU), backward twice that,
plus the LM head 2·s·h·V (x3) once. Norms and element-wise work are memory-bound and left out.
A training policy (`POLICIES`: states, checkpoint mode, LM head; `memory.policy_of` reads the name)
sets the memory (`memory.step_memory`) and the recompute: full recomputes the layer's forward
(attention included), sc++ the GEMMs only (LoongTrain SC++ keeps the attention output), seq:f the
GEMMs of a fraction f of the tokens (the runner keeps the attention whole).
MFU = model FLOPs (without recompute) / (step time x P x peak).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from seqpar.algorithms.base import DTYPES, AttnShape
from seqpar.experiments.clusters import Cluster
from seqpar.experiments.perf import memory
from seqpar.experiments.perf.api import Prediction, predict, predict_spec
from seqpar.model.config import ModelConfig

# every training policy the model scope ranks: states x checkpoint mode x LM head (bf16 compute
# with fp32 master weights for 16-bit dtypes; `memory.policy_of` parses a name)
POLICIES = tuple(f"{states} {ck}{' fused' if fused else ''}" for states in ("fsdp", "replicated")
                 for ck in ("none", "full", "sc++", "seq:0.5", "sc++,seq:0.5")
                 for fused in (False, True))
CHECKPOINTS = POLICIES


def gemm_flops(cfg: ModelConfig, tokens: int) -> float:
    """Forward FLOPs of one layer's GEMMs for `tokens` tokens."""
    h, kv = cfg.hidden, cfg.kv_heads * cfg.head_dim
    return 2.0 * tokens * (h * (h + 2 * kv) + h * h + 3 * h * cfg.ffn)


def shape_of(cfg: ModelConfig, seq_len: int, batch: int = 1, elem_bytes: int = 2) -> AttnShape:
    return AttnShape(batch, seq_len, cfg.heads, cfg.kv_heads, cfg.head_dim, elem_bytes)


def step(p: Prediction, cfg: ModelConfig, cluster: Cluster, shape: AttnShape, world: int,
         checkpoint: str | memory.TrainPolicy = "full", dtype: str = "bfloat16") -> Prediction:
    """The attention-scope prediction `p` extended to a training step with `checkpoint`."""
    tokens = shape.batch * shape.seq_len // world
    gemm_rate = cluster.rate(dtype, "gemm")
    g_fwd = gemm_flops(cfg, tokens) / gemm_rate
    head = 3 * 2.0 * tokens * cfg.hidden * cfg.vocab / gemm_rate
    attn_fwd, attn = p.forward_ms / 1e3, p.attention_ms / 1e3
    policy = checkpoint if isinstance(checkpoint, memory.TrainPolicy) else memory.policy_of(
        checkpoint, dtype)
    recompute = {"none": 0.0, "full": g_fwd + attn_fwd, "sc++": g_fwd}.get(
        policy.checkpoint, policy.seq_fraction * g_fwd)
    seconds = cfg.layers * (3 * g_fwd + attn + recompute) + head
    model_flops = (cfg.layers * 3 * gemm_flops(cfg, tokens) + 3 * 2.0 * tokens * cfg.hidden * cfg.vocab
                   + cfg.layers * attention_flops_per_rank(shape, world))
    peak = memory.step_peak(p.algorithm, shape, world, p.options, cfg, policy, p.peak_mem_bytes,
                            dtype)
    return replace(p, step_ms=1e3 * seconds, mfu=model_flops / (seconds * cluster.peak(dtype)),
                   peak_mem_bytes=peak, fits=peak <= cluster.memory_gb * 1e9)


def step_peak(name: str, shape: AttnShape, world: int, options: dict, cfg: ModelConfig,
              checkpoint: str, attention_bytes: int, dtype: str = "bfloat16") -> int:
    """Bytes one rank holds at a training step's peak (what `fits` compares to the device)."""
    return memory.step_peak(name, shape, world, options, cfg, checkpoint, attention_bytes, dtype)


def attention_flops_per_rank(shape: AttnShape, world: int) -> float:
    """Causal attention forward + backward FLOPs per rank (the papers' 3.5 x forward)."""
    from seqpar.algorithms.kernels import attention_flops

    return 3.5 * attention_flops(shape.batch, shape.seq_len, shape.seq_len, shape.heads,
                                 shape.head_dim, "causal") / world


def predict_trial(spec: Any, cluster: Cluster) -> Prediction:
    """A Prediction for any ExperimentSpec: an attention trial's, or a training trial's step (its
    model, SP = world / dp, its policy) with `memory` holding the step's memory parts."""
    if spec.train is None:
        return predict_spec(spec, cluster)
    case = spec.to_case()
    cfg, dtype = case.config(), spec.workload.dtype
    shape = shape_of(cfg, case.seq_len, case.batch, DTYPES[dtype].itemsize)
    p = predict(cluster, case.algorithm, shape, case.sp, nodes=max(1, spec.plan.nodes // case.dp),
                options=dict(spec.plan.options), layout=case.layout, causal=True, dtype=dtype)
    policy = case.policy()
    q = step(p, cfg, cluster, shape, case.sp, policy, dtype)
    q.memory = memory.step_memory(case.algorithm, shape, case.sp, dict(spec.plan.options), cfg,
                                  policy, p.peak_mem_bytes, dtype, case.dp)
    return replace(q, peak_mem_bytes=q.memory["peak"],
                   fits=q.memory["peak"] <= cluster.memory_gb * 1e9)
