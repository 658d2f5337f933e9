"""The planner of a step of variable-length sequences (perf/lengths*.py): it deals with rules.deal
(the runner's function), its micro-batches cost what the attention scope predicts, a distribution
costs its own sequences (not its mean's), the parts add up to the step, and --validate pairs a
trial's predicted imbalance with its load_imbalance."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from seqpar.experiments.spec import ExperimentSpec, specs_of
from seqpar.experiments.steps import make_case
from seqpar.planner import clusters
from seqpar.planner import plan as perf_plan
from seqpar.planner.lengths import Workload, deal_cost, layout_rank_pairs
from seqpar.planner.lengths_plan import LengthPlan
from seqpar.planner.lengths_step import PARTS, Split
from seqpar.planner.lengths_time import predict_case
from seqpar.planner.policy import Filters
from seqpar.rules.deal import deal

ROOT = Path(__file__).resolve().parents[2]
MODEL = str(ROOT / "benchmarks" / "plan_lengths_model.yaml")
LONG_TAIL = "lognormal:mean=1024,sigma=1.5,min=128,max=8192"


def plan_of(spec: str = LONG_TAIL, world: int = 8, tokens: int = 2 ** 18, capacity: int = 2048,
            **kw) -> LengthPlan:
    work = Workload.of(spec, tokens=tokens, longest=8192, capacity=capacity,
                       seed=random.randrange(50), **kw)
    return LengthPlan.make(clusters.load("h100-sxm"), MODEL, work, world, max(1, world // 4))


def test_the_plan_deals_with_the_runners_function():
    plan = plan_of()
    cost = deal_cost(plan.cfg, plan.cluster, "bfloat16", capacity=2048, world=8,
                     ranks_per_node=4)
    assert cost == plan.cost
    for split, extra in ((Split("dynamic"), {}), (Split("static", 4, "cost-balanced"),
                                                  {"degree": 4, "packing": "cost-balanced"}),
                         (Split("dynamic", equal_counts=True), {"equal_counts": True})):
        for lengths, table in zip(plan.work.draws, plan.tables(split), strict=True):
            assert table.deal == deal(lengths, 8, 2048, split.policy, cost, ranks_per_node=4,
                                      **extra)


def test_a_full_micro_batch_costs_what_the_attention_scope_predicts():
    # one sequence of d x capacity a micro-batch: the attention's kernels and exposed
    # communication are the attention scope's prediction of it, every layer, exactly
    plan = plan_of("fixed:8192", tokens=8192 * 4)
    for name in ("ring", "ulysses", "usp"):
        steps = [s for s in plan.search(Filters(algorithm=name, sp=4), ("static",), ("best-fit",))
                 if s.policy.states == "replicated"]
        s = steps[0]
        p = plan.rates(4, name, s.options, s.layout).prediction
        micro = 2  # 4 sequences of 8,192 on 2 replicas of 4 ranks: 2 micro-batches a rank
        total = (s.parts["attention"] + s.parts["attention_comm"]) / micro
        assert total == pytest.approx(plan.cfg.layers * p.attention_ms, rel=1e-9), name
        assert s.imbalance == pytest.approx(1.0) and s.parts["idle"] == pytest.approx(0, abs=1e-9)


def test_two_distributions_with_one_mean_cost_their_own_sequences(tmp_path):
    spread = tmp_path / "spread.txt"
    spread.write_text("256\n1792\n")  # mean 1,024
    fixed = plan_of("fixed:1024", capacity=2048)
    mixed = plan_of(f"file:{spread}", capacity=2048)
    # ~256 sequences a step drawn from two lengths: the mean within 3 standard errors of 1,024
    assert np.mean([x for b in mixed.work.draws for x in b]) == pytest.approx(1024, rel=0.15)
    f = fixed.search(Filters(algorithm="ring"), ("dynamic",))[0]
    m = mixed.search(Filters(algorithm="ring"), ("dynamic",))[0]
    assert set(f.degrees) == set(m.degrees) == {1}  # every sequence on one rank: no SP at all
    # the same tokens: the same linear work; the attention follows the sum of L², 1.56x here
    assert m.parts["other_compute"] == pytest.approx(f.parts["other_compute"], rel=0.02)
    assert 1.3 < m.parts["attention"] / f.parts["attention"] < 1.7
    assert m.step_ms > f.step_ms * 1.001


def test_steps_add_up_and_rank_dynamic_over_static_on_a_long_tail():
    plan = plan_of(world=8)
    steps = plan.search()
    assert steps == sorted(steps, key=lambda s: (not s.fits, -s.tgs if s.fits else
                                                 s.peak_mem_bytes))
    for s in steps:
        j = s.json()
        assert {"sp_policy", "packing", "capacity"} <= set(j) and j["capacity"] == 2048
        p = j["predicted"]
        assert {"imbalance", "busy_imbalance", "gap", "degrees", "parts_ms"} <= set(p)
        assert set(p["parts_ms"]) == set(PARTS)
        assert sum(s.parts.values()) == pytest.approx(s.step_ms, rel=1e-9)
        assert s.tgs == pytest.approx(plan.work.tokens / (s.step_ms / 1e3 * 8))
        assert s.imbalance >= 1.0 and s.busy_imbalance >= 1.0 and s.gap >= 1.0 - 1e-9
        assert s.fits == (s.peak_mem_bytes <= plan.cluster.memory_gb * 1e9)
    best = {}
    for s in steps:
        if s.fits:
            best.setdefault(s.sp_policy, s)
    # every short sequence pays a static group's communication and waits on its pack's slowest
    assert best["dynamic"].step_ms < best["static"].step_ms
    assert best["dynamic"].parts["attention_comm"] < best["static"].parts["attention_comm"]


def test_fsdp_under_the_dynamic_policy_needs_equal_counts_and_zero1_does_not():
    # FSDP gathers every layer over the pool on every forward: the runner refuses it under the
    # dynamic policy unless every rank runs as many micro-batches; replicated states and zero1
    # (the moments sharded, no gathers) run the free deal; the plan keeps to that
    plan = plan_of(world=4)
    seen = set()
    for s in plan.search(Filters(algorithm="ring")):
        if s.sp_policy == "dynamic":
            assert (s.policy.states == "dp_sp") == s.split.equal_counts, s.policy
        seen.add((s.sp_policy, s.split.equal_counts, s.policy.states))
    assert seen >= {("dynamic", False, "replicated"), ("dynamic", False, "zero1"),
                    ("dynamic", True, "dp_sp"), ("static", False, "replicated"),
                    ("static", False, "zero1"), ("static", False, "dp_sp")}
    only = plan.search(Filters(algorithm="ring", states="zero1"), ("dynamic",))
    assert only and {(s.split.equal_counts, s.policy.states) for s in only} == {(False, "zero1")}
    fsdp = plan.search(Filters(algorithm="ring", states="dp_sp"), ("dynamic",))
    assert fsdp and {s.split.equal_counts for s in fsdp} == {True}  # FSDP: equal counts only


def test_validate_pairs_the_predicted_imbalance_with_load_imbalance():
    trials = []
    for policy in ("static", "dynamic"):
        spec = ExperimentSpec.parse({
            "model": {"heads": 4, "kv_heads": 2, "head_dim": 16},
            "plan": {"algorithm": "ring", "world": 2, "sp_policy": policy, "capacity": 64},
            "workload": {"seq_len": 128, "lengths": "lognormal:mean=32,sigma=1.5,min=4,max=128",
                         "tokens_per_step": 512}, "train": {"model": "tiny"}})
        params = {k: str(v) for k, v in spec.flat().items()}  # as MLflow stores them
        trials.append((params, {"step_ms": 50.0, "load_imbalance": 1.1}))
    checks = perf_plan.validate(specs_of(trials), clusters.load("local"))
    assert len(checks) == 2 and all(c.imbalance is not None for c in checks)
    for c in checks:
        assert 1.0 <= c.imbalance[0] < 1.5 and c.imbalance[1] == 1.1
    s = perf_plan.summary(checks)
    assert s["imbalance_median_abs_error"] == pytest.approx(
        np.median([abs(c.imbalance[0] - 1.1) / 1.1 for c in checks]))


def test_a_trials_rank_pairs_follow_its_layout():
    case = make_case("ring", 4, "lognormal:mean=10,sigma=1,min=2,max=40", tokens=96, capacity=12,
                     policy="dynamic", batches=1)
    d = case.batches[0].deal
    for layout in ("zigzag", "stripe", "contiguous"):
        pairs = layout_rank_pairs(d, layout)
        assert pairs.sum() == sum(n * (n + 1) // 2 for n in d.lengths)
    s = predict_case(case, clusters.load("local"))
    pairs = layout_rank_pairs(d, "zigzag")
    assert s.imbalance == pytest.approx(pairs.max() / pairs.mean())
    assert set(s.by_size) == set(case.group_sizes())
