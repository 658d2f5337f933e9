"""Named studies: each is a base spec and a grid (see grid.py) per preset, a headline metric and a plot.

    study = STUDIES["throughput"]
    base, grid = study.sweep("cpu")          # or "gpu-cluster": the papers' sizes
    points = study.points("cpu")            # validated specs, or the reason a point cannot run

The `cpu` preset is sized for 2 CPU cores (1-2 minutes); `gpu-cluster` is the papers' scale (7B/8B
shapes, 128K-1M tokens, world 8-64) for a Ray cluster with GPUs. Points whose algorithm is not
registered yet are skipped with that reason, so a study starts working the day its algorithm lands.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from seqpar import algorithms
from seqpar.errors import require
from seqpar.experiments.grid import Point, expand
from seqpar.experiments.spec import PENDING

PRESET_NAMES = ("cpu", "gpu-cluster")
Sweep = tuple[dict[str, Any], dict[str, Any]]

# the shared starting points: a tiny CPU shape at world 4, and a 7B shape on GPUs
CPU_BASE = {"model": "tiny", "plan": {"world": 4, "layout": "zigzag"},
            "workload": {"causal": True, "dtype": "float32", "warmup": 1, "iters": 3},
            "env": {"device": "cpu", "timeout_s": 300.0}}
GPU_BASE = {"model": "llama2-7b", "plan": {"world": 8, "layout": "zigzag", "nodes": 1},
            "workload": {"causal": True, "dtype": "bfloat16", "warmup": 2, "iters": 10},
            "env": {"device": "cuda", "timeout_s": 1800.0}}
# a slow network between virtual nodes on one host, so placement shows on a laptop
CPU_LINKS = {"intra": {"latency_us": 5.0, "bandwidth_gb_per_s": 10.0},
             "inter": {"latency_us": 50.0, "bandwidth_gb_per_s": 1.0}}

ALL = [{"algorithm": "local", "world": 1}, {"algorithm": "allgather"}, {"algorithm": "ulysses"},
       {"algorithm": "ring"}, {"algorithm": "usp", "options": {"dhp": 2, "dcp": 2}},
       {"algorithm": "double_ring", "options": {"inner_ring": 2}},
       {"algorithm": "wallfacer", "options": {"team_size": 2}}, {"algorithm": "burst"}]


def gpu_all(world: int) -> list[dict[str, Any]]:
    """Every algorithm at a GPU world size: USP with 4-way head parallelism, double ring of 2."""
    return [{"algorithm": "allgather"}, {"algorithm": "ulysses"}, {"algorithm": "ring"},
            {"algorithm": "usp", "options": {"dhp": 4, "dcp": world // 4}},
            {"algorithm": "double_ring", "options": {"inner_ring": world // 2}},
            {"algorithm": "wallfacer", "options": {"team_size": 2}}, {"algorithm": "burst"}]


def _base(preset: str, **sections: dict[str, Any]) -> dict[str, Any]:
    """The preset's base with some sections updated (a shallow merge per section)."""
    base = {k: (dict(v) if isinstance(v, dict) else v)
            for k, v in (CPU_BASE if preset == "cpu" else GPU_BASE).items()}
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values} if isinstance(base.get(name), dict) else values
    return base


@dataclass(frozen=True)
class Study:
    name: str
    description: str
    headline: str                    # the metric `seqpar compare` ranks by
    higher_is_better: bool
    plot: str                        # throughput | memory | scaling | bytes_by_link | bar
    build: Callable[[str], Sweep]    # preset -> (base, grid)
    requires: tuple[str, ...] = ()   # algorithms the study is about
    notes: dict[str, str] = field(default_factory=dict)

    def sweep(self, preset: str = "cpu") -> Sweep:
        require(preset in PRESET_NAMES, "preset", preset, f"must be one of {', '.join(PRESET_NAMES)}")
        return self.build(preset)

    def missing(self) -> list[str]:
        """Required algorithms that are not registered yet."""
        return [a for a in self.requires if a not in algorithms.REGISTRY]

    def status(self) -> str:
        missing = self.missing()
        if not missing:
            return "ready"
        return "waits for " + ", ".join(f"{a} ({PENDING.get(a, 'not registered')})" for a in missing)

    def points(self, preset: str = "cpu") -> list[Point]:
        return expand(*self.sweep(preset))


def _throughput(preset: str) -> Sweep:
    if preset == "cpu":
        return _base(preset), {"plan": ALL, "workload.seq_len": [1024, 2048, 4096]}
    return (_base(preset, plan={"world": 16, "nodes": 2}),
            {"plan": [{"algorithm": "local", "world": 1, "nodes": 1}, *gpu_all(16)],
             "workload.seq_len": [131072, 262144, 524288, 1048576]})


def _memory(preset: str) -> Sweep:
    if preset == "cpu":
        return (_base(preset, workload={"iters": 2}),
                {"plan": ALL, "workload.seq_len": [1024, 2048, 4096, 8192]})
    return (_base(preset, workload={"iters": 3}),
            {"plan": [{"algorithm": "local", "world": 1}, *gpu_all(8)],
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
                "env": {"link_emulation": CPU_LINKS}}
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


STUDIES: dict[str, Study] = {s.name: s for s in (
    Study("throughput", "tokens/s of every algorithm against local as the sequence grows",
          "tokens_per_s", True, "throughput", _throughput),
    Study("memory", "peak memory per rank against sequence length", "peak_mem_bytes", False,
          "memory", _memory),
    Study("strong-scaling", "fixed sequence, more ranks: speed-up and efficiency over local",
          "tokens_per_s", True, "scaling", _scaling(weak=False)),
    Study("weak-scaling", "sequence grows with the ranks: efficiency stays near 1 when it scales",
          "tokens_per_s_per_rank", True, "scaling", _scaling(weak=True)),
    Study("mha-vs-gqa", "bytes sent with H/Hkv = 1 and 4: who gains from GQA (burst loses, §3.1)",
          "bytes_total", False, "bar", _mha_vs_gqa),
    Study("load-balance", "max/mean FLOPs over ranks for contiguous, zigzag and stripe (causal)",
          "load_imbalance", False, "bar", _load_balance),
    Study("placement", "USP head-first vs context-first over 2 nodes (LoongTrain §4.4)",
          "step_ms", False, "bytes_by_link", _placement, requires=("usp",)),
    Study("ring-size", "double ring: inner ring size w over 2 nodes (LoongTrain §4.3)",
          "step_ms", False, "bytes_by_link", _ring_size, requires=("double_ring",)),
    Study("wallfacer-c", "WallFacer team size C (C=1 ring, C=sqrt(P) collectives) x placement",
          "step_ms", False, "bytes_by_link", _wallfacer_c, requires=("wallfacer",)),
    Study("burst-backward", "BurstAttention's backward vs ring's, MHA and GQA (BurstEngine §3.1)",
          "bytes_total", False, "bar", _burst_backward, requires=("burst",)),
)}
