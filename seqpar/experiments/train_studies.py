"""The model training studies' sweeps (registry.STUDIES names them): throughput, checkpointing, the
LM head, DP x SP scaling and real text. On GPUs a training point uses what a real run would: bf16
compute, fp32 master weights, states sharded by FSDP over the DP x SP world, the fused head."""

from __future__ import annotations

from typing import Any

from seqpar.experiments.sweep_bases import CPU_PLANS, Sweep, _base, gpu_plans
from seqpar.model.config import MODELS


def _train_base(preset: str, model: str | None = None, **sections: dict[str, Any]) -> dict[str, Any]:
    """A training trial's base: the decoder preset (`seqpar.model.MODELS`) and its attention shape."""
    name = model or ("tiny" if preset == "cpu" else "llama2-7b")
    cfg = MODELS[name]
    base = _base(preset, model={"heads": cfg.heads, "kv_heads": cfg.kv_heads,
                                "head_dim": cfg.head_dim},
                 workload={"batch": 1, "warmup": 1, "iters": 3 if preset == "cpu" else 5})
    # on GPUs what a real run uses: bf16 compute, fp32 master weights and moments, states sharded
    # by FSDP over the DP x SP world, the fused LM head
    real = {} if preset == "cpu" else {"states": "fsdp", "master_dtype": "float32",
                                       "fused_head": True}
    if preset != "cpu":
        base["workload"]["dtype"] = "bfloat16"
    base["train"] = {"model": name, **real, **sections.pop("train", {})}
    for key, values in sections.items():
        base[key] = {**base.get(key, {}), **values}
    return base


def _e2e_throughput(preset: str) -> Sweep:
    if preset == "cpu":
        return _train_base(preset), {"plan": CPU_PLANS, "workload.seq_len": [256, 512, 1024]}
    return (_train_base(preset, plan={"world": 16, "nodes": 2}, train={"checkpoint": "sc++"}),
            {"plan": gpu_plans(16), "workload.seq_len": [131072, 262144, 524288]})


CHECKPOINT_AXIS = [{"train.checkpoint": "none"}, {"train.checkpoint": "full"},
                   {"train.checkpoint": "sc++"},
                   *({"train.checkpoint": "sequence", "train.seq_fraction": f} for f in (0.25, 0.5)),
                   {"train.checkpoint": "sc++,sequence", "train.seq_fraction": 0.5}]


def _checkpointing(preset: str) -> Sweep:
    if preset == "cpu":
        return (_train_base(preset, plan={"algorithm": "ring"}),
                {"ckpt": CHECKPOINT_AXIS, "workload.seq_len": [512, 1024]})
    return (_train_base(preset, model="14b", plan={"algorithm": "burst", "world": 32, "nodes": 4}),
            {"ckpt": CHECKPOINT_AXIS, "workload.seq_len": [262144, 1048576]})


def _lm_head(preset: str) -> Sweep:
    vocabs = [8192, 32768, 131072]
    if preset == "cpu":
        return (_train_base(preset, plan={"algorithm": "ring", "world": 2},
                            workload={"seq_len": 512}, train={"checkpoint": "sc++"}),
                {"train.vocab": vocabs, "train.fused_head": [False, True]})
    return (_train_base(preset, model="llama3-8b", plan={"algorithm": "ring", "world": 8},
                        workload={"seq_len": 131072}, train={"checkpoint": "sc++"}),
            {"train.vocab": vocabs, "train.fused_head": [False, True]})


def _e2e_scaling(preset: str) -> Sweep:
    world = 4 if preset == "cpu" else 32
    splits = [{"train.dp": d} for d in (1, 2, 4) + (() if preset == "cpu" else (8,))]
    n = 1024 if preset == "cpu" else 262144
    train = {} if preset == "cpu" else {"checkpoint": "sc++"}
    return (_train_base(preset, plan={"world": world}, workload={"seq_len": n}, train=train),
            {"plan.algorithm": ["ring", "ulysses"], "split": splits})


def _text(preset: str) -> Sweep:
    """The decoder on real text (bytes as tokens, paragraphs packed as documents): the loss of every
    step is logged as the metric `loss`, so MLflow draws the learning curve."""
    data = {"data": {"text": "shipped:sequence-parallelism"}}
    if preset == "cpu":
        return (_train_base(preset, plan={"algorithm": "ring", "world": 2},
                            workload={"seq_len": 256, "iters": 60, "warmup": 0, **data},
                            train={"lr": 3e-3}),
                {"train.states": ["replicated", "fsdp"]})
    return (_train_base(preset, model="llama2-7b", plan={"algorithm": "usp", "world": 8},
                        workload={"seq_len": 32768, "iters": 50, "warmup": 0,
                                  "dtype": "bfloat16", **data},
                        train={"lr": 3e-4, "states": "fsdp", "master_dtype": "float32",
                               "checkpoint": "sc++", "vocab": 256}),
            {"plan.options": [{"dhp": 8}]})
