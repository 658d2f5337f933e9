"""The cost model a step's deal is made with, from a cluster's rates (`rules.deal.CostModel`).

    cost = cost_model(cfg, clusters.load("local"), "float32")

Per visible (query, key) pair of causal attention, forward and backward, over every layer:
4·H·D FLOPs forward, 2.5x that backward (`rules.flops`), at the cluster's attention rate. Per
token: the blocks' GEMMs and the LM head, 3x their forward FLOPs, at the GEMM rate. Per token on a
group of d > 1 ranks: the K,V a ring carries, 2·Hkv·D elements a layer forward and twice that
backward, times (d - 1) / d, at one GPU's intra-node bandwidth (not overlapped: an upper bound).
The planner's whole-step model refines each part; this is what the driver deals a run's step by.
"""

from __future__ import annotations

from seqpar.experiments.clusters import Cluster
from seqpar.rules.deal import CostModel
from seqpar.rules.flops import BACKWARD_FLOPS, gemm_flops, head_flops
from seqpar.rules.model import ModelConfig
from seqpar.rules.shape import DTYPE_BYTES


def _rate(table: dict[str, float], dtype: str) -> float:
    """TFLOP/s for `dtype`, else the table's first (a CPU file measures one dtype)."""
    tflops = table.get(dtype) or next(iter(table.values()), 1.0)
    return tflops * 1e12


def cost_model(cfg: ModelConfig, cluster: Cluster, dtype: str, window: int | None = None
               ) -> CostModel:
    """The deal's cost model for `cfg` on `cluster` (see the module docstring)."""
    pair = cfg.layers * 4.0 * cfg.heads * cfg.head_dim * (1 + BACKWARD_FLOPS)
    token = 3.0 * (cfg.layers * gemm_flops(cfg, 1) + head_flops(cfg, 1))
    kv_bytes = cfg.layers * 3 * 2 * cfg.kv_heads * cfg.head_dim * DTYPE_BYTES.get(dtype, 2)
    return CostModel(attention=pair / _rate(cluster.attention_tflops, dtype),
                     linear=token / _rate(cluster.gemm_tflops, dtype),
                     comm=kv_bytes / (cluster.intra.bandwidth_gb_per_s * 1e9), window=window)
