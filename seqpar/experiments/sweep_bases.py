"""The starting points every study's sweep is built from: a preset's base spec (a tiny CPU shape at
world 4, or a 7B shape on GPUs), slow virtual links for one host, and every algorithm in the form
each preset runs it."""

from __future__ import annotations

from typing import Any

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
# the emulated twin of LoongTrain's testbed: its links slowed by this machine's compute over an A100's
TWIN = {"cluster": "loongtrain-a100"}

# every algorithm in the form the cpu preset runs it (world 4; local on one rank)
CPU_PLANS = [{"algorithm": "local", "world": 1}, {"algorithm": "allgather"}, {"algorithm": "ulysses"},
       {"algorithm": "ring"}, {"algorithm": "usp", "options": {"dhp": 2, "dcp": 2}},
       {"algorithm": "double_ring", "options": {"inner_ring": 2}},
       {"algorithm": "wallfacer", "options": {"team_size": 2}}, {"algorithm": "burst"}]


def gpu_plans(world: int) -> list[dict[str, Any]]:
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
