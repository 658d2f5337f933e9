"""A training trial's steps of variable-length sequences, dealt on the driver: the cost model the
deal is made with, from a cluster's rates (`rules.deal.CostModel`), and a TrainCase with its
batches dealt (what `seqpar check --lengths` and the tests build by hand; a sweep's spec does the
same from its sections).

    cost = cost_model(cfg, clusters.load("local"), "float32")
    case = make_case("ring", 4, "lognormal:mean=10,sigma=1,min=2,max=40", tokens=96, capacity=8,
                     policy="dynamic")

Per visible (query, key) pair of causal attention, forward and backward, over every layer:
4·H·D FLOPs forward, 2.5x that backward (`rules.flops`), at the cluster's attention rate. Per
token: the blocks' GEMMs and the LM head, 3x their forward FLOPs, at the GEMM rate. Per token on a
group of d > 1 ranks: the K,V a ring carries, 2·Hkv·D elements a layer forward and twice that
backward, times (d - 1) / d, at one GPU's intra-node bandwidth (not overlapped: an upper bound).
The planner's whole-step model refines each part; this is what the driver deals a run's step by.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from seqpar.case import TrainCase
from seqpar.errors import ConfigError
from seqpar.experiments import clusters
from seqpar.experiments.clusters import Cluster
from seqpar.rules import lengths as length_rules
from seqpar.rules.deal import CostModel, check_lengths, plan_batches
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


def dealt(case: TrainCase, lengths: str, *, tokens: int | None = None, batches: int = 2,
          policy: str = "static", packing: str = "best-fit", capacity: int | None = None,
          equal_counts: bool = False, any_size: bool = False, ranks_per_node: int | None = None,
          window: int | None = None, cluster: str = "local",
          resolve: Callable[[str], str] | None = None) -> TrainCase:
    """`case` with a step of variable-length sequences: `batches` seeded batches of `tokens`
    tokens (default: the pool's capacity) drawn from `lengths` and dealt to the pool under
    `policy` with `cluster`'s rates (`rules.deal.plan_batches`), once, here on the driver.
    `capacity` defaults to seq_len over the static SP degree (a static group holds the longest
    sequence); `resolve` maps a path as written to the file read (shipped texts)."""
    dist = length_rules.parse(lengths, "workload.lengths", resolve)
    if isinstance(dist, length_rules.Empirical):  # the ranks read the file the driver resolved
        path = resolve(dist.path) if resolve is not None else dist.path
        lengths = f"{dist.kind}:{path}"
    world = case.world
    capacity = capacity or -(-case.seq_len // case.sp)
    tokens = tokens or max(world * capacity, case.seq_len)
    check_lengths([min(length_rules.longest(dist), case.seq_len)], world, capacity, policy,
                  case.sp if policy == "static" else None)
    cost = cost_model(case.config(), clusters.load(cluster), case.dtype, window)
    extra: dict[str, Any] = ({"degree": case.sp} if policy == "static" else
                             {"equal_counts": equal_counts, "any_size": any_size})
    planned = plan_batches(dist, tokens, case.seq_len, case.seed, batches, world, capacity,
                           policy, cost, packing=packing, ranks_per_node=ranks_per_node, **extra)
    return dataclasses.replace(case, lengths=lengths, tokens_per_step=tokens, sp_policy=policy,
                               packing=packing, capacity=capacity, equal_counts=equal_counts,
                               window=window, batches=planned)


def make_case(algorithm: str, world: int, lengths: str, tokens: int, capacity: int,
              policy: str, *, model: str = "tiny", layout: str = "zigzag", seed: int = 0,
              batches: int = 1, packing: str = "best-fit", states: str = "replicated",
              equal_counts: bool = False, dp: int = 1, window: int | None = None,
              options: dict[str, Any] | None = None, longest: int | None = None,
              overrides: tuple[tuple[str, int], ...] = (), dtype: str = "float64",
              checkpoint: str = "none", fused_head: bool = False,
              any_size: bool = False) -> TrainCase:
    """A float64 training case of `world` ranks with its batches dealt (`dealt`): what `seqpar
    check --lengths` and the tests build."""
    sp = world if policy == "dynamic" else world // dp
    base = TrainCase(algorithm=algorithm, sp=sp, dp=1 if policy == "dynamic" else dp,
                     layout=layout, model=model, model_overrides=overrides, dtype=dtype,
                     seq_len=longest or tokens, seed=seed, states=states, warmup=0, iters=1,
                     checkpoint=checkpoint, fused_head=fused_head,
                     options=tuple(sorted((options or {}).items())))
    return dealt(base, lengths, tokens=tokens, batches=batches, policy=policy, packing=packing,
                 capacity=capacity, equal_counts=equal_counts, window=window, any_size=any_size)


def check_cases(names: Sequence[str], world: int, lengths: str, *, capacity: int | None,
                tokens: int | None, longest: int, heads: int, kv_heads: int, head_dim: int,
                layouts: Sequence[str], seed: int,
                forms: Mapping[str, Callable[[int], dict[str, Any]]] | None = None,
                ) -> tuple[list[TrainCase], list[tuple[str, str]]]:
    """`seqpar check --lengths`: the tiny decoder (heads, kv_heads, head_dim; MHA and GQA) under
    each policy for each algorithm, the layouts taken in turn, in float64. The capacity defaults
    to the longest sequence over the pool (the longest needs every rank, the rest less: more than
    one group size), the step's tokens to 4 x the pool's capacity. Returns the cases and, for the
    ones that cannot run, (label, why)."""
    dist = length_rules.parse(lengths, "lengths")
    longest = min(length_rules.longest(dist), longest)
    capacity = capacity or max(2, -(-longest // world))
    tokens = tokens or 4 * world * capacity
    cases, skipped = [], []
    for i, name in enumerate(n for n in names if n != "local" or world == 1):
        for j, policy in enumerate(("static", "dynamic")):
            for kv in dict.fromkeys((heads, kv_heads)):
                label = f"{name} {policy} H={heads}/{kv}"
                options = forms[name](world) if forms and name in forms else {}
                try:
                    case = make_case(
                        name, world, lengths, tokens, capacity, policy, seed=seed,
                        layout=layouts[(i + j) % len(layouts)], options=options, longest=longest,
                        overrides=(("vocab", 61), ("heads", heads), ("kv_heads", kv),
                                   ("hidden", heads * head_dim), ("ffn", 48)))
                    case.validate()
                except ConfigError as err:
                    skipped.append((label, str(err)))
                    continue
                cases.append(case)
    return cases, skipped
