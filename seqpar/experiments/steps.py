"""A training trial's steps of variable-length sequences, dealt on the driver: the cost model the
deal is made with, from a cluster's rates (`rules.deal.CostModel`), and a TrainCase with its
batches dealt (what `seqpar check --lengths` and the tests build by hand; a sweep's spec does the
same from its sections).

    cost = cost_model(cfg, clusters.load("local"), "float32")
    case = make_case("ring", 4, "lognormal:mean=10,sigma=1,min=2,max=40", tokens=96, capacity=8,
                     policy="dynamic")

The cost model is the planner's (`planner/lengths.py: deal_cost`): the attention per
visible pair at the kernel's rate and its small-call curve, the GEMMs, element-wise work and head
per token, a ring's K,V per token over the links each group size spans, the fixed cost of a
micro-batch; `seqpar plan --lengths` deals with the same function, so a run and its plan deal
alike (the cluster file `local` for a run here: `dealt(cluster=)`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from seqpar.case import TrainCase
from seqpar.corpus.cache import lengths_file
from seqpar.errors import ConfigError
from seqpar.experiments.corpora import train_on
from seqpar.planner import clusters
from seqpar.planner.clusters import Cluster
from seqpar.planner.lengths import deal_cost
from seqpar.planner.lengths_auto import auto_algorithms
from seqpar.rules import lengths as length_rules
from seqpar.rules.cost_model import CostModel
from seqpar.rules.deal import check_lengths, plan_batches
from seqpar.rules.model import ModelConfig
from seqpar.rules.pool import AUTO


def cost_model(cfg: ModelConfig, cluster: Cluster, dtype: str, window: int | None = None, *,
               capacity: int = 2048, world: int | None = None,
               ranks_per_node: int | None = None, any_size: bool = False) -> CostModel:
    """The deal's cost model for `cfg` on `cluster`: the planner's (`perf.lengths.deal_cost`;
    with `any_size` a group's communication rate at every size, not only the powers of two)."""
    return deal_cost(cfg, cluster, dtype, window=window, capacity=capacity, world=world,
                     ranks_per_node=ranks_per_node, any_size=any_size)


def dealt(case: TrainCase, lengths: str, *, tokens: int | None = None, batches: int = 2,
          policy: str = "static", packing: str = "best-fit", capacity: int | None = None,
          equal_counts: bool = False, any_size: bool = False, ranks_per_node: int | None = None,
          window: int | None = None, cluster: str = "local",
          resolve: Callable[[str], str] | None = None, degrees: str = "smallest",
          nodes: int = 1) -> TrainCase:
    """`case` with a step of variable-length sequences: `batches` seeded batches of `tokens`
    tokens (default: the pool's capacity) drawn from `lengths` and dealt to the pool under
    `policy` with `cluster`'s rates (`rules.deal.plan_batches`), once, here on the driver.
    `capacity` defaults to seq_len over the static SP degree (a static group holds the longest
    sequence); `resolve` maps a path as written to the file read (shipped texts)."""
    dist = length_rules.parse(lengths, "workload.lengths", resolve, corpus=lengths_file)
    if isinstance(dist, length_rules.Empirical) and dist.kind == "corpus":
        # the ranks read the corpus's token ids; the lengths as a file (what the planner reads)
        case, path = train_on(case, length_rules.corpus_ref(lengths), "workload.lengths")
        lengths = f"file:{path}"
    elif isinstance(dist, length_rules.Empirical):  # the ranks read the file the driver resolved
        path = resolve(dist.path) if resolve is not None else dist.path
        lengths = f"{dist.kind}:{path}"
    world = case.world
    capacity = capacity or -(-case.seq_len // case.sp)
    tokens = tokens or max(world * capacity, case.seq_len)
    check_lengths([min(dist.high, case.seq_len)], world, capacity, policy,
                  case.sp if policy == "static" else None)
    cost = cost_model(case.config(), clusters.load(cluster), case.dtype, window,
                      capacity=capacity, world=world, ranks_per_node=ranks_per_node,
                      any_size=any_size and policy == "dynamic")
    extra: dict[str, Any] = ({"degree": case.sp} if policy == "static" else
                             {"equal_counts": equal_counts, "any_size": any_size,
                              "degrees": degrees})
    planned = plan_batches(dist, tokens, case.seq_len, case.seed, batches, world, capacity,
                           policy, cost, packing=packing, ranks_per_node=ranks_per_node, **extra)
    by_size: tuple = ()
    if case.algorithm == AUTO and policy == "dynamic":
        sizes = sorted({m.size for b in planned for m in b.deal.micro})
        chosen = auto_algorithms(clusters.load(cluster), case.config(), case.dtype, capacity,
                                 world, nodes, sizes, case.layout, window)
        by_size = tuple((d, name, tuple(sorted(opts.items())))
                        for d, (name, opts) in sorted(chosen.items()))
    return dataclasses.replace(case, lengths=lengths, tokens_per_step=tokens, sp_policy=policy,
                               packing=packing, capacity=capacity, equal_counts=equal_counts,
                               any_size=any_size and policy == "dynamic",
                               degrees=degrees if policy == "dynamic" else "smallest",
                               algorithms_by_size=by_size, window=window, batches=planned)


def make_case(algorithm: str, world: int, lengths: str, tokens: int, capacity: int,
              policy: str, *, model: str = "tiny", layout: str = "zigzag", seed: int = 0,
              batches: int = 1, packing: str = "best-fit", states: str = "replicated",
              equal_counts: bool = False, dp: int = 1, window: int | None = None,
              options: dict[str, Any] | None = None, longest: int | None = None,
              overrides: tuple[tuple[str, int], ...] = (), dtype: str = "float64",
              checkpoint: str = "none", fused_head: bool = False,
              any_size: bool = False, degrees: str = "smallest") -> TrainCase:
    """A float64 training case of `world` ranks with its batches dealt (`dealt`): what `seqpar
    check --lengths` and the tests build."""
    sp = world if policy == "dynamic" else world // dp
    base = TrainCase(algorithm=algorithm, sp=sp, dp=1 if policy == "dynamic" else dp,
                     layout=layout, model=model, model_overrides=overrides, dtype=dtype,
                     seq_len=longest or tokens, seed=seed, states=states, warmup=0, iters=1,
                     checkpoint=checkpoint, fused_head=fused_head,
                     options=tuple(sorted((options or {}).items())))
    return dealt(base, lengths, tokens=tokens, batches=batches, policy=policy, packing=packing,
                 capacity=capacity, equal_counts=equal_counts, window=window, any_size=any_size,
                 degrees=degrees)


def check_cases(names: Sequence[str], world: int, lengths: str, *, capacity: int | None,
                tokens: int | None, longest: int, heads: int, kv_heads: int, head_dim: int,
                layouts: Sequence[str], seed: int,
                forms: Mapping[str, Callable[[int], dict[str, Any]]] | None = None,
                ) -> tuple[list[TrainCase], list[tuple[str, str]]]:
    """`seqpar check --lengths`: the tiny decoder (heads, kv_heads, head_dim; MHA and GQA) under
    each policy for each algorithm, the layouts taken in turn, in float64, and the dynamic policy
    with group sizes by cost, for the first algorithm and for `auto`. The capacity defaults
    to the longest sequence over the pool (the longest needs every rank, the rest less: more than
    one group size), the step's tokens to 4 x the pool's capacity. Returns the cases and, for the
    ones that cannot run, (label, why)."""
    dist = length_rules.parse(lengths, "lengths", corpus=lengths_file)
    longest = min(dist.high, longest)
    capacity = capacity or max(2, -(-longest // world))
    tokens = tokens or 4 * world * capacity
    cases, skipped = [], []

    def add(label: str, name: str, policy: str, kv: int, layout: str, seed_: int,
            degrees: str = "smallest") -> None:
        """One float64 case of the tiny decoder with kv KV heads, validated (else skipped)."""
        try:
            case = make_case(
                name, world, lengths, tokens, capacity, policy, seed=seed_, layout=layout,
                options=forms[name](world) if forms and name in forms else {}, longest=longest,
                degrees=degrees, overrides=(("vocab", 61), ("heads", heads), ("kv_heads", kv),
                                            ("hidden", heads * head_dim), ("ffn", 48)))
            case.validate()
        except ConfigError as err:
            skipped.append((label, str(err)))
            return
        cases.append(case)

    for i, name in enumerate(n for n in names if n != "local" or world == 1):
        for j, policy in enumerate(("static", "dynamic")):
            for kv in dict.fromkeys((heads, kv_heads)):
                add(f"{name} {policy} H={heads}/{kv}", name, policy, kv,
                    layouts[(i + j) % len(layouts)], seed)
    # the dynamic policy's choices (issue 37): group sizes by cost, and with each size's
    # algorithm chosen by the planner, MHA and GQA
    first = next((n for n in names if n != "local"), None)
    if world > 1:
        for k, kv in enumerate(dict.fromkeys((heads, kv_heads))):
            for name in ("auto", *((first,) if first else ())):
                add(f"{name} dynamic degrees=cost H={heads}/{kv}", name, "dynamic", kv,
                    layouts[k % len(layouts)], seed + 1 + k, degrees="cost")
    return cases, skipped
