"""Named studies: each is a base spec and a grid (see grid.py) per preset, a headline metric and a plot.

    study = STUDIES["throughput"]
    base, grid = study.sweep("cpu")          # or "gpu-cluster": the papers' sizes
    points = study.points("cpu")            # validated specs, or the reason a point cannot run

The `cpu` preset is sized for 2 CPU cores (1-2 minutes); `gpu-cluster` is the papers' scale (7B/8B
shapes, 128K-1M tokens, world 8-64) for a Ray cluster with GPUs. A point that breaks a rule (a
shape an algorithm cannot split) is skipped with that reason.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from seqpar import planner
from seqpar.errors import ConfigError, require
from seqpar.experiments.grid import Point, expand
from seqpar.experiments.kind_studies import _attention_kinds
from seqpar.experiments.mask_studies import _masks, _sparse
from seqpar.experiments.moe_studies import _moe_placement
from seqpar.experiments.sweep_bases import (  # noqa: F401  (the names studies are built from)
    CPU_BASE,
    CPU_LINKS,
    CPU_PLANS,
    GPU_BASE,
    PRESET_NAMES,
    TWIN,
    Sweep,
    _base,
    gpu_plans,
)
from seqpar.experiments.train_studies import (
    _checkpointing,
    _e2e_scaling,
    _e2e_throughput,
    _lm_head,
    _model_families,
    _sp_policies,
    _text,
)
from seqpar.planner import clusters

# metrics where less is better (by prefix); every other metric (tokens/s, TGS, MFU, TFLOP/s) is
# better higher. The one table the comparison and the sweep's headline read.
LOWER_IS_BETTER = ("step_ms", "fwd_ms", "bwd_ms", "peak_mem", "bytes", "load_imbalance", "setup_s",
                   "run_s", "activation_bytes", "recomputed_flops", "err_", "attn_flops", "loss",
                   "state_bytes")


def higher_is_better(metric: str) -> bool:
    """Whether a larger value of this logged metric is the better trial."""
    return not metric.startswith(LOWER_IS_BETTER)


@dataclass(frozen=True)
class Study:
    name: str
    description: str
    headline: str                    # the metric `seqpar compare` ranks by
    build: Callable[[str], Sweep]    # preset -> (base, grid)

    def sweep(self, preset: str = "cpu") -> Sweep:
        require(preset in PRESET_NAMES, "preset", preset, f"must be one of {', '.join(PRESET_NAMES)}")
        return self.build(preset)

    def points(self, preset: str = "cpu") -> list[Point]:
        return fitting(expand(*self.sweep(preset)), MEMORY_CLUSTER[preset])


# the device whose memory a preset's points must fit
MEMORY_CLUSTER = {"cpu": "local", "gpu-cluster": "loongtrain-a100"}


def fitting(points: list[Point], cluster: str) -> list[Point]:
    """Points whose predicted peak memory per rank exceeds the cluster's device memory become
    skipped, with the arithmetic as the reason."""
    c = clusters.load(cluster)
    out = []
    for p in points:
        if p.spec is not None:
            peak = planner.predict_trial(p.spec, c).peak_mem_bytes
            if peak > c.memory_gb * 1e9:
                why = (f"predicted peak {peak / 1e9:.1f} GB per rank exceeds the {c.memory_gb:g} GB "
                       f"of a {cluster} device")
                p = Point(p.overrides, None, ConfigError("memory", p.spec.label(), why))
        out.append(p)
    return out


def _throughput(preset: str) -> Sweep:
    if preset == "cpu":  # on the emulated twin (TWIN, below): an A100 node's compute/link balance
        return (_base(preset, env={"link_emulation": TWIN}),
                {"plan": CPU_PLANS, "workload.seq_len": [1024, 2048, 4096]})
    return (_base(preset, plan={"world": 16, "nodes": 2}),
            {"plan": [{"algorithm": "local", "world": 1, "nodes": 1}, *gpu_plans(16)],
             "workload.seq_len": [131072, 262144, 524288, 1048576]})


def _memory(preset: str) -> Sweep:
    if preset == "cpu":
        return (_base(preset, workload={"iters": 2}),
                {"plan": CPU_PLANS, "workload.seq_len": [1024, 2048, 4096, 8192]})
    return (_base(preset, workload={"iters": 3}),
            {"plan": [{"algorithm": "local", "world": 1}, *gpu_plans(8)],
             "workload.seq_len": [131072, 262144, 524288]})


def _scaling(weak: bool) -> Callable[[str], Sweep]:
    def build(preset: str) -> Sweep:
        # cpu: worlds up to the cores this machine has (at least 1 and 2), so no point measures
        # ranks contending for a core
        cores = max(2, os.cpu_count() or 1)
        worlds, n, algos = (tuple(w for w in (1, 2, 4, 8) if w <= cores), 1024,
                            ("allgather", "ulysses", "ring")) if preset == "cpu" \
            else ((8, 16, 32, 64), 32768, ("ulysses", "ring", "usp", "double_ring"))
        per_node = 8

        def point(algo: str, world: int) -> dict[str, Any]:
            p = {"plan.algorithm": algo, "plan.world": world,
                 "workload.seq_len": n * world if weak else n * worlds[-1]}
            if preset != "cpu":
                p["plan.nodes"] = max(1, world // per_node)
            if algo == "usp":
                p["plan.options"] = {"dhp": 8 if world >= 8 else world, "dcp": world // min(world, 8)}
            if algo == "double_ring":
                p["plan.options"] = {"inner_ring": min(world, per_node)}
            return p

        first = worlds[0] if preset == "cpu" else 1
        baseline = [{"plan.algorithm": "local", "plan.world": 1, "plan.nodes": 1,
                     "workload.seq_len": n * first if weak else n * worlds[-1]}]
        return _base(preset), {"point": baseline + [point(a, w) for a in algos for w in worlds]}
    return build


def _mha_vs_gqa(preset: str) -> Sweep:
    algos = [{"algorithm": a} for a in ("allgather", "ulysses", "ring", "burst")]
    if preset == "cpu":
        return _base(preset, workload={"seq_len": 2048}), {"plan": algos, "model.kv_heads": [8, 2]}
    return (_base(preset, model="llama3-8b", workload={"seq_len": 262144}),
            {"plan": algos, "model.kv_heads": [32, 8]})


def _load_balance(preset: str) -> Sweep:
    n = 2048 if preset == "cpu" else 262144
    return (_base(preset, workload={"seq_len": n}),
            {"plan.algorithm": ["ring", "allgather"], "plan.layout": ["contiguous", "zigzag", "stripe"]})




def _nodes(preset: str) -> dict[str, Any]:
    if preset == "cpu":
        return {"plan": {"world": 4, "nodes": 2, "layout": "zigzag"},
                "env": {"link_emulation": TWIN}}
    return {"plan": {"world": 32, "nodes": 4, "layout": "zigzag"}}


def _placement(preset: str) -> Sweep:
    b = _nodes(preset)
    w = b["plan"]["world"]
    usp = [{"algorithm": "usp", "options": {"dhp": d, "dcp": w // d, "placement": pl}}
           for d in ((2,) if preset == "cpu" else (4, 8)) for pl in ("head-first", "context-first")]
    return (_base(preset, workload={"seq_len": 2048 if preset == "cpu" else 262144}, **b),
            {"plan": [{"algorithm": "ring"}, {"algorithm": "ulysses"}, *usp]})


def _ring_size(preset: str) -> Sweep:
    b = _nodes(preset)
    sizes = (1, 2, 4) if preset == "cpu" else (1, 2, 4, 8)
    return (_base(preset, workload={"seq_len": 2048 if preset == "cpu" else 262144}, **b),
            {"plan": [{"algorithm": "ring"}] + [
                {"algorithm": "double_ring", "options": {"inner_ring": s}} for s in sizes]})


def _wallfacer_c(preset: str) -> Sweep:
    b = _nodes(preset)
    cs = (1, 2) if preset == "cpu" else (1, 2, 4)  # C^2 must divide P
    return (_base(preset, workload={"seq_len": 2048 if preset == "cpu" else 262144}, **b),
            {"plan": [{"algorithm": "ring"}] + [
                {"algorithm": "wallfacer", "options": {"team_size": c, "placement": pl}}
                for c in cs for pl in ("collective-intra", "p2p-intra")]})


def _burst_backward(preset: str) -> Sweep:
    n = 2048 if preset == "cpu" else 262144
    kv = [8, 2] if preset == "cpu" else [32, 8]
    return (_base(preset, workload={"seq_len": n, "mode": "fwd+bwd"}),
            {"plan.algorithm": ["ring", "burst"], "model.kv_heads": kv})


# ------------------------------------------------------------------ real sequences: documents, windows
LAYOUTS = ["contiguous", "zigzag", "stripe"]


def _varlen(preset: str) -> Sweep:
    """Packed documents from a seeded long-tailed draw; every algorithm x layout (each layout
    deals the documents its own way: zigzag per document, stripe round robin)."""
    if preset == "cpu":
        docs = {"count": 16, "spread": 1.25, "seed": 0}  # 32..1382 tokens, 256 on average
        base = _base(preset, workload={"seq_len": 4096, "documents": docs})
        plans = [{"plan": CPU_PLANS[0]}] + [{"plan": {**p, "layout": lay}} for p in CPU_PLANS[1:]
                                      for lay in LAYOUTS]
        return base, {"point": plans}
    docs = {"count": 128, "spread": 1.25, "seed": 0}  # 2K tokens per document on average
    return (_base(preset, plan={"world": 16, "nodes": 2},
                  workload={"seq_len": 262144, "documents": docs}),
            {"plan": gpu_plans(16), "plan.layout": LAYOUTS})


def _sliding_window(preset: str) -> Sweep:
    """Window W swept from N/32 to N/2 against full causal (window null)."""
    if preset == "cpu":
        n, plans = 4096, [{"algorithm": "local", "world": 1}, {"algorithm": "allgather"},
                          {"algorithm": "ulysses"}, {"algorithm": "ring"},
                          {"algorithm": "ring", "layout": "stripe"}, {"algorithm": "burst"}]
        return (_base(preset, workload={"seq_len": n}),
                {"plan": plans, "workload.window": [None, n // 2, n // 8, n // 32]})
    n = 131072
    return (_base(preset, model="llama3-8b", workload={"seq_len": n}),
            {"plan": [*gpu_plans(8), {"algorithm": "ring", "layout": "stripe"}],
             "workload.window": [None, n // 2, n // 8, n // 32]})


def _accuracy_plans(worlds: range, heads: int) -> list[dict[str, Any]]:
    """Every algorithm at every world size its rules allow (options scaled to the world), and
    the plain kernel (`local`) at world 1."""
    plans: list[dict[str, Any]] = [{"algorithm": "local", "world": 1}]
    for p in worlds:
        plans += [{"algorithm": "allgather", "world": p}, {"algorithm": "ring", "world": p},
                  {"algorithm": "burst", "world": p}]
        if heads % p == 0:
            plans.append({"algorithm": "ulysses", "world": p})
        if p % 2 == 0:
            plans += [{"algorithm": "usp", "world": p, "options": {"dhp": 2, "dcp": p // 2}},
                      {"algorithm": "double_ring", "world": p, "options": {"inner_ring": 2}}]
        if p % 4 == 0:
            plans.append({"algorithm": "wallfacer", "world": p, "options": {"team_size": 2}})
    return plans


def _accuracy(preset: str) -> Sweep:
    """Error against float64 by algorithm, world 1..8 and dtype, on fixed seeded inputs. N is a
    multiple of 2P for every P <= 8 (1680 = lcm), so every world deals the same sequence evenly."""
    mode = {"mode": "accuracy", "warmup": 0, "iters": 1, "seed": 0}
    if preset == "cpu":
        return (_base(preset, workload={"seq_len": 1680, **mode}),
                {"plan": _accuracy_plans(range(2, 9), 8), "workload.dtype": ["float32", "bfloat16"]})
    return (_base(preset, model="llama3-8b", plan={"nodes": 1},
                  workload={"seq_len": 8 * 1680, **mode}),
            {"plan": _accuracy_plans(range(2, 9), 32), "workload.dtype": ["bfloat16", "float32"]})


# ------------------------------------------------------------------------------- peers
def _peer_plans(preset: str) -> list[dict[str, Any]]:
    """Each of seqpar's algorithms beside the peers that do the same thing, in the layout both
    deal: Ulysses (contiguous) and the load-balanced ring (zigzag, torch's head-tail)."""
    plans = [{"algorithm": "ulysses", "layout": "contiguous"},
             {"algorithm": "peer:yunchang-ulysses", "layout": "contiguous"},
             {"algorithm": "ring", "layout": "zigzag"},
             *({"algorithm": "peer:torch-cp-ring", "layout": "zigzag", "options": {"rotate": r}}
               for r in ("allgather", "alltoall"))]
    if preset != "cpu":  # the GPU-only peers (TE and MagiAttention have no byte model to plan by)
        plans += [{"algorithm": "peer:ring-flash-zigzag", "layout": "zigzag"},
                  {"algorithm": "peer:ring-flash-llama3", "layout": "contiguous"},
                  {"algorithm": "usp", "layout": "contiguous", "options": {"dhp": 4}},
                  {"algorithm": "peer:yunchang-usp", "layout": "contiguous",
                   "options": {"ulysses_degree": 4}}]
    return plans


def _peers(preset: str) -> Sweep:
    if preset == "cpu":  # P = 2 on 2 cores: a few seconds a trial, the same CPU kernel on both sides
        return (_base(preset, plan={"world": 2}, workload={"warmup": 2, "iters": 10}),
                {"plan": _peer_plans(preset), "workload.seq_len": [1024, 2048]})
    return (_base(preset, model="llama3-8b", workload={"seq_len": 131072}),
            {"plan": _peer_plans(preset)})


STUDIES: dict[str, Study] = {s.name: s for s in (
    Study("throughput", "tokens/s of every algorithm against local as the sequence grows",
          "tokens_per_s", _throughput),
    Study("memory", "peak memory per rank against sequence length", "peak_mem_bytes", _memory),
    Study("strong-scaling", "fixed sequence, more ranks: speed-up and efficiency over local",
          "tokens_per_s", _scaling(weak=False)),
    Study("weak-scaling", "sequence grows with the ranks: efficiency stays near 1 when it scales",
          "tokens_per_s_per_rank", _scaling(weak=True)),
    Study("mha-vs-gqa", "bytes sent with H/Hkv = 1 and 4: who gains from GQA (burst loses, §3.1)",
          "bytes_total", _mha_vs_gqa),
    Study("load-balance", "max/mean FLOPs over ranks for contiguous, zigzag and stripe (causal)",
          "load_imbalance", _load_balance),
    Study("placement", "USP head-first vs context-first over 2 nodes (LoongTrain §4.4)",
          "step_ms", _placement),
    Study("ring-size", "double ring: inner ring size w over 2 nodes (LoongTrain §4.3)",
          "step_ms", _ring_size),
    Study("wallfacer-c", "WallFacer team size C (C=1 ring, C=sqrt(P) collectives) x placement",
          "step_ms", _wallfacer_c),
    Study("e2e-throughput", "the model trained with every algorithm: TGS and MFU as N grows",
          "tgs", _e2e_throughput),
    Study("checkpointing", "activation memory vs step time: none, full, sc++ (LoongTrain §5.2), "
          "sequence(f), sc++ + sequence", "activation_bytes", _checkpointing),
    Study("lm-head", "fused vs unfused LM head + loss: peak memory and time vs vocabulary "
          "(BurstEngine §3.3)", "peak_mem_bytes", _lm_head),
    Study("e2e-scaling", "DP x SP splits of a fixed number of ranks: TGS", "tgs",
          _e2e_scaling),
    Study("text", "the decoder on real text (byte tokens, packed documents): the learning curve",
          "loss_last", _text),
    Study("burst-backward", "BurstAttention's backward vs ring's, MHA and GQA (BurstEngine §3.1)",
          "bytes_total", _burst_backward),
    Study("sp-policies", "a step of long-tailed sequences: static SP (best-fit or cost-balanced "
          "packs) vs dynamic SP (each sequence on the smallest group that holds it; states "
          "replicated or dist-opt), every algorithm: TGS, imbalance, idle time", "tgs",
          _sp_policies),
    Study("model-families", "the families' decoders (dense, QK-norm, a window pattern, sinks, "
          "MoE) trained alike: TGS, memory and the loss falling on real text", "tgs",
          _model_families),
    Study("attention-kinds", "MHA, GQA, MLA (K,V or latent ring) and a linear hybrid (3 gated "
          "DeltaNet layers to 1 full, LASP-2) trained at equal width: TGS, bytes, memory", "tgs",
          _attention_kinds),
    Study("moe-placement", "a mixture of experts with expert parallelism beside SP: EP 1/2/4 x "
          "ring and Ulysses x EP groups within a node or across nodes: TGS, memory, the "
          "all-to-all bytes by link, the experts' load imbalance", "tgs", _moe_placement),
    Study("varlen", "packed documents of long-tailed lengths: tokens/s and load imbalance (max/mean "
          "FLOPs) per algorithm and layout, beside equal work", "tokens_per_s", _varlen),
    Study("sliding-window", "window W from N/32 to N/2 against full causal: time, FLOPs and bytes "
          "saved (BurstEngine §3.4)", "step_ms", _sliding_window),
    Study("accuracy", "forward and backward error against float64 by algorithm, world 1..8 and "
          "dtype, on fixed seeded inputs", "err_max", _accuracy),
    Study("peers", "seqpar's algorithms beside the peers' own code doing the same thing "
          "(peer:<name>): ulysses vs yunchang, ring vs torch's context-parallel ring", "step_ms",
          _peers),
    Study("sparse", "BurstEngine Table 3: a mask on the full schedule vs causal, window, block-"
          "sparse and dilated masks balanced (and not): TGS of the whole model step", "tgs",
          _sparse),
    Study("masks", "every algorithm under each kind of mask, balanced layout: tokens/s, TFLOP/s, "
          "load imbalance, bytes", "tokens_per_s", _masks),
)}
