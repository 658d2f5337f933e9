"""The predicted step of one configuration of a plan of lengths (`time_step`), and of a training
trial of lengths as it runs (`predict_case`).

A step (`LengthStep`) = the deal's free-schedule makespan (replicated or zero1 states: each rank
runs its micro-batches as soon as its group is free) or its rounds (FSDP over the pool: every round
waits for its longest micro-batch and FSDP's gathers and reduce-scatters of the round), + the
gradient all-reduce over the pool once a step (replicated, zero1) + AdamW (zero1: over its share,
then the parameters' broadcast). Its parts, in ms, sum to the step: `attention`,
`attention_comm`, `other_compute`, `recompute` (each the mean rank's), `idle` (what the mean rank
waits: the imbalance), `exposed_comm` (FSDP's time past the rounds, the gradient reduction,
zero1's broadcast), `optimizer`. `imbalance` is max / mean of the ranks' attention FLOPs (the runner's
`load_imbalance`), `busy_imbalance` of their busy seconds, `gap` the deal's own makespan over its
lower bound.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from seqpar.planner import host
from seqpar.planner.clusters import Cluster
from seqpar.planner.lengths import Table, Workload, layout_rank_pairs, softmax_layers
from seqpar.planner.lengths_costs import LengthCosts
from seqpar.planner.lengths_step import PARTS, LengthStep, Split
from seqpar.planner.policy import Policy, split_checkpoint
from seqpar.planner.rates import DEFAULT_KERNEL
from seqpar.planner.step import _optimizer_seconds
from seqpar.planner.trial import policy_of_case
from seqpar.rules import lengths as length_rules
from seqpar.rules.deal import DEGREES
from seqpar.rules.flops import BACKWARD_FLOPS, gemm_flops, step_flops
from seqpar.rules.pool import LOCAL


def time_step(plan: LengthCosts, split: Split, name: str, options: dict[str, Any], layout: str,
              by_size: dict[int, tuple[str, dict]], policy: Policy, linear_sp: str | None = None
              ) -> LengthStep:
    """One configuration's step under `plan`'s deals of `split` (see the module docstring), the
    mean over the batches; a hybrid's linear layers under `plan.lasp(linear_sp)`."""
    cfg, layers, train = plan.cfg, plan.cfg.layers, policy.train(plan.dtype)
    sizes, lasp = sorted(by_size), plan.lasp(linear_sp)
    rates = [plan.rates(d, *by_size[d], layout, lasp) for d in sizes]
    g, mlp, ew, hd = plan.token_rates
    rec_lin, full = plan.recompute(policy)
    fsdp = policy.states == "dp_sp"
    comm = plan.traffic(policy, train)
    round_comm = layers * max(comm.busy(k) for k in ("intra", "inter")) if fsdp else 0.0
    edges = comm.gather.seconds + comm.scatter.seconds + comm.root
    reduce = 0.0 if fsdp else layers * comm.reduce.seconds + comm.reduce_root + (
        comm.update.seconds)  # zero1's broadcast of the updated parameters
    optimizer = _optimizer_seconds(plan.setup, cfg, policy, train, plan.world, 1)
    issue = [plan.issue(d, *by_size[d], layout, train.checkpoint, train.fused_head, lasp)
             for d in sizes]
    once = plan.issue_once(train.states)
    overlaps = host.overlaps(plan.cluster)
    device_total = host_total = 0.0
    tables = plan.tables(split)
    seen = softmax_layers(cfg) / layers  # of the layers, those that see (query, key) pairs
    totals = dict.fromkeys(PARTS, 0.0)
    spans, busy_imb, rank_pairs, flops = [], [], np.zeros(plan.world), [0.0, 0.0, 0.0]
    for t in tables:
        at = np.searchsorted(sizes, t.size)

        def of(key: str, at: np.ndarray = at) -> np.ndarray:
            return np.array([getattr(r, key) for r in rates])[at]

        per_rank = t.tokens / t.size
        softmax = of("attention") * t.eff  # a hybrid's linear layers besides: LASP's exposed
        attn = softmax + of("mixer") * per_rank
        exposed = np.maximum(0.0, of("link") * t.tokens - of("hidden") * softmax) + of("mixer_fixed")
        other = (3 * layers * (g + ew) + hd) * per_rank
        rec = layers * rec_lin * per_rank + (of("forward") * (attn + exposed) if full else 0.0)
        device = attn + exposed + other + rec
        docs = t.docs if t.docs is not None else np.ones_like(t.tokens)
        issued = (np.array([i[0] for i in issue])[at]
                  + (docs - 1) * np.array([i[1] for i in issue])[at])
        seconds = np.maximum(device, issued) if overlaps else device + issued
        totals["host"] += float(((seconds - device) * t.size).sum()) / plan.world
        device_total += float((device * t.size).sum()) / plan.world
        host_total += float((issued * t.size).sum()) / plan.world
        busy, span = t.schedule(seconds)
        mean = float(busy.mean())
        if fsdp:
            longest = t.rounds(seconds)
            span = float(np.maximum(longest, round_comm).sum()) + len(longest) * edges
            late = span - float(longest.sum())
            span_busy = float(longest.sum())
        else:
            span, late, span_busy = span + reduce, reduce, span
        for key, part in (("attention", attn), ("attention_comm", exposed),
                          ("other_compute", other), ("recompute", rec)):
            totals[key] += float((part * t.size).sum()) / plan.world
        totals["idle"] += span_busy - mean
        totals["exposed_comm"] += late
        spans.append(span + host.stretch(plan.cluster, optimizer, once))
        totals["host"] += host.stretch(plan.cluster, optimizer, once) - optimizer
        device_total, host_total = device_total + optimizer, host_total + once
        busy_imb.append(float(busy.max()) / mean if mean > 0 else 1.0)
        rank_pairs += t.rank_pairs
        flops[0] += seen * float(t.causal.sum() if plan.work.window is None else t.pairs.sum())
        flops[1] += seen * float(t.square.sum())
        flops[2] += seen * float(t.pairs.sum())
    k = len(tables)
    totals["optimizer"] = optimizer * k
    seconds = sum(spans) / k
    mem = plan.memory(by_size, policy)
    tokens = plan.work.tokens
    mode, frac = split_checkpoint(policy.checkpoint)
    share = {"none": 0.0, "full": 1.0, "sc++": 1.0}.get(mode, frac)
    attn_flop = 4.0 * cfg.heads * cfg.head_dim * cfg.layers
    recomputed = cfg.layers * share * gemm_flops(cfg, tokens) + (
        attn_flop * flops[2] / k if full else 0.0)
    peak = plan.cluster.peak(plan.dtype) * plan.world * seconds
    degrees: dict[int, int] = {}
    for t in tables:
        for d, n in t.degrees.items():
            degrees[d] = degrees.get(d, 0) + n
    return LengthStep(
        split, name if len(sizes) > 1 or sizes[0] > 1 else LOCAL, options, dict(by_size),
        layout, policy, plan.work.capacity, plan.world, plan.kernel, 1e3 * seconds,
        tokens / (seconds * plan.world),
        step_flops(cfg, 1, tokens, flops[0] / k) / peak,
        step_flops(cfg, 1, tokens, flops[1] / k) / peak,
        (step_flops(cfg, 1, tokens, flops[2] / k, BACKWARD_FLOPS) + recomputed) / peak,
        float(rank_pairs.max() / rank_pairs.mean()) if rank_pairs.mean() > 0 else 1.0,
        sum(busy_imb) / k, sum(t.deal.gap for t in tables) / k,
        sum(float(t.size.sum()) for t in tables) / (k * plan.world),
        {d: round(n / k, 2) for d, n in sorted(degrees.items())}, mem["peak"],
        mem["peak"] <= plan.cluster.memory_gb * 1e9,
        {key: 1e3 * v / k for key, v in totals.items()}, mem,
        host_bound=host.bound(plan.cluster, device_total, host_total),
        mla_pass=getattr(rates[-1].prediction, "mla_pass", None),
        linear_sp=lasp if "linear" in cfg.layer_types else None)


def predict_case(case: Any, cluster: Cluster, nodes: int = 1) -> LengthStep:
    """A training trial of lengths (a TrainCase with its batches dealt) as it runs: its own deals,
    algorithm, options at each group size, layout and policy (`seqpar plan --validate`)."""
    work = Workload(length_rules.parse(case.lengths), case.tokens_per_step, case.seq_len,
                    case.capacity, len(case.batches), case.seed, case.window)
    plan = LengthCosts.make(cluster, case.config(), work, case.world, nodes, dtype=case.dtype,
                            kernel=cluster.kernel or DEFAULT_KERNEL)
    plan.mla_pass = getattr(case, "mla_pass", "kv")  # as it ran
    plan.linear_sp = getattr(case, "linear_sp", None) or "lasp2"
    split = Split(case.sp_policy, case.sp if case.sp_policy == "static" else None, case.packing,
                  case.equal_counts, case.any_size, getattr(case, "degrees", DEGREES[0]))
    plan.dealt(split, [Table.of(b.deal, plan.cluster.kernel_half_tokens, case.window)
                       for b in case.batches])
    by_size = {d: case.options_at(d) for d in case.group_sizes()}
    policy = policy_of_case(case)[0]
    s = time_step(plan, split, case.algorithm, dict(case.options), case.layout, by_size, policy)
    pairs = sum(layout_rank_pairs(b.deal, case.layout, case.window) for b in case.batches)
    s.imbalance = float(pairs.max() / pairs.mean()) if pairs.mean() > 0 else 1.0
    return s
