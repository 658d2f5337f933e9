"""The model training studies' sweeps (registry.STUDIES names them): throughput, checkpointing, the
LM head, DP x SP scaling, real text, SP policies and the model families. On GPUs a training point
uses what a real run would: bf16 compute, fp32 master weights, states sharded by FSDP over the
DP x SP world, the fused head."""

from __future__ import annotations

from typing import Any

from seqpar.experiments.sweep_bases import CPU_PLANS, Sweep, _base, gpu_plans
from seqpar.model.config import MODELS
from seqpar.rules.model import ModelConfig


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


# the long tail of the cpu preset: 32..1024 tokens, 160 on average (a few long, many short)
CPU_LENGTHS = "lognormal:mean=160,sigma=1.2,min=32,max=1024"
POLICY_AXIS = [{"plan.sp_policy": "static", "plan.packing": "best-fit"},
               {"plan.sp_policy": "static", "plan.packing": "cost-balanced"},
               {"plan.sp_policy": "dynamic"}]


def _sp_policies(preset: str) -> Sweep:
    """A step of long-tailed sequences under each SP policy: static (one SP degree sized for the
    longest, packs best-fit by tokens or balanced by predicted work) against dynamic (each
    sequence on the smallest group that holds it; again with states sharded by Megatron's
    distributed optimizer, dist-opt, which needs no equal counts; with group sizes by cost; and
    with the algorithm of each group size chosen by the planner, auto), every algorithm as the
    groups' attention. The cpu preset runs P = 2, one rank a core (the times measure the
    policies, not contention)."""
    if preset == "cpu":
        plans = [p for p in CPU_PLANS if p["algorithm"] not in ("local", "usp", "double_ring",
                                                                "wallfacer")]
        return (_train_base(preset, plan={"world": 2, "capacity": 512},
                            workload={"seq_len": 1024, "lengths": CPU_LENGTHS,
                                      "tokens_per_step": 4096, "batches": 2}),
                {"plan": [{**p, "world": 2} for p in plans],
                 "policy": [*POLICY_AXIS, {**POLICY_AXIS[2], "train.states": "dist-opt"},
                            {**POLICY_AXIS[2], "plan.degrees": "cost"},
                            # one trial whatever the plan: each group size's algorithm chosen
                            {**POLICY_AXIS[2], "plan.degrees": "cost", "plan.algorithm": "auto"}]})
    # a 32-GPU pool over 4 nodes, an 8B model on a long tail up to 128K (capacity 8K a GPU:
    # the static degree 16 holds the longest; dynamic groups from 1 to 32), states sharded by
    # FSDP over the pool (dynamic: every rank as many micro-batches), and dynamic with ZeRO-1's
    # moments sharded over the pool instead (no equal counts; full checkpointing: with whole
    # parameters and gradients sc++ at 8K tokens a rank is predicted at 92 GB of an A100's 80)
    return (_train_base(preset, model="llama3.1-8b", plan={"world": 32, "nodes": 4,
                                                           "capacity": 8192},
                        workload={"seq_len": 131072, "tokens_per_step": 1048576, "batches": 2,
                                  "lengths": "lognormal:mean=4096,sigma=1.5,min=256,max=131072"},
                        train={"checkpoint": "sc++"}),
            {"plan": [{k: v for k, v in p.items() if k != "options"} |
                      ({"options": {"dhp": 4}} if p["algorithm"] == "usp" else
                       {"options": p["options"]} if "options" in p else {})
                      for p in gpu_plans(16)],  # usp's dcp follows each group's size
             "policy": [{**p, "train.dp": 2} for p in POLICY_AXIS[:2]] + [
                 {**POLICY_AXIS[2], "train.dp": 1, "plan.equal_counts": True},  # FSDP over the pool
                 {**POLICY_AXIS[2], "train.dp": 1, "train.states": "zero1",
                  "train.checkpoint": "full"},
                 {**POLICY_AXIS[2], "train.dp": 1, "train.states": "dist-opt",  # Megatron's
                  "train.checkpoint": "full"}]})


# the families' decoders: dense (LLaMA), QK-norm and a free head_dim (Qwen3), a window pattern
# (Gemma 3: five sliding layers to one full, its own RoPE base, sandwich norms, GeGLU, tied),
# sinks (gpt-oss: with its alternating 128-token windows, YaRN, biases and experts) and MoE
# (Qwen3-MoE: 8 experts, top-2); on the cpu preset their tiny versions (models/tiny-*.json)
CPU_FAMILIES = ("tiny", "tiny-qwen3", "tiny-gemma3", "tiny-gpt-oss", "tiny-qwen3-moe")
GPU_FAMILIES = ("llama3.1-8b", "qwen3-8b", "gemma-3-27b", "gpt-oss-20b", "qwen3-30b-a3b")


def family_axis(names: tuple[str, ...]) -> list[dict[str, Any]]:
    """A grid axis over models: each its `train.model` and the attention shape it has (a name
    that is not a preset stays a point its spec refuses, with the reason)."""
    out: list[dict[str, Any]] = []
    for name in names:
        point: dict[str, Any] = {"train.model": name}
        if name in MODELS:
            cfg: ModelConfig = MODELS[name]
            point.update({"model.heads": cfg.heads, "model.kv_heads": cfg.kv_heads,
                          "model.head_dim": cfg.head_dim})
        out.append(point)
    return out


def _model_families(preset: str) -> Sweep:
    """Each family's decoder trained with ring and Ulysses: tokens/s, TGS, memory and the loss
    falling on real text (every step's loss logged: MLflow draws the curves side by side). The
    cpu preset runs P = 2, 512 tokens of the shipped text a step, 20 timed steps."""
    if preset == "cpu":
        data = {"data": {"text": "shipped:sequence-parallelism"}}
        return (_train_base(preset, plan={"world": 2},
                            workload={"seq_len": 512, "warmup": 1, "iters": 20, **data},
                            train={"lr": 3e-3}),
                {"family": family_axis(CPU_FAMILIES), "plan.algorithm": ["ring", "ulysses"]})
    return (_train_base(preset, model=GPU_FAMILIES[0], plan={"world": 16, "nodes": 2},
                        workload={"seq_len": 131072}, train={"checkpoint": "sc++"}),
            {"family": family_axis(GPU_FAMILIES), "plan": gpu_plans(16)})
