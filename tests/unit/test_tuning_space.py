"""The tuning space: every registered algorithm x its options x layout; invalid ones explained."""

from __future__ import annotations

from seqpar import algorithms
from seqpar.rules.layouts import LAYOUTS
from seqpar.sweeps.tune import divisors, option_space, tuning_plan


def test_tuning_space_covers_every_algorithm_and_layout():
    plan = tuning_plan(4, "tiny", 1024)
    assert plan.experiment == "tune"
    algos = {p.spec.plan.algorithm for p in plan.trials}
    assert algos == set(algorithms.REGISTRY) - {"local"}
    assert {p.spec.plan.layout for p in plan.trials} == set(LAYOUTS)
    for p in plan.skipped:
        assert p.error is not None and p.error.rule


def test_local_is_the_whole_space_at_world_one():
    plan = tuning_plan(1, "tiny", 64)
    assert {p.spec.plan.algorithm for p in plan.trials} == {"local"}


def test_option_space_only_varies_options_the_algorithm_takes():
    assert divisors(8) == [1, 2, 4, 8]
    assert option_space("ring", 4) == [{}]
    if "usp" in algorithms.REGISTRY and "dhp" in algorithms.options_of("usp"):
        combos = option_space("usp", 4)
        assert all(c["dhp"] * c.get("dcp", 4 // c["dhp"]) == 4 for c in combos)


def test_cost_model_prunes_to_the_k_fastest_and_says_why():
    plan = tuning_plan(4, "tiny", 1024, prune=2)
    assert len(plan.trials) == 2
    pruned = [p for p in plan.skipped if p.error.field == "costmodel"]
    assert pruned and all("pruned by the performance model" in p.error.rule for p in pruned)


def test_cost_model_ranks_by_compute_and_the_slowest_link():
    from seqpar.experiments.spec import ExperimentSpec
    from seqpar.planner import clusters, predict_spec

    def spec(algorithm: str, nodes: int = 1, kv: int = 32) -> ExperimentSpec:
        return ExperimentSpec.parse({"model": {"preset": "llama2-7b", "kv_heads": kv},
                                     "plan": {"algorithm": algorithm, "world": 8, "nodes": nodes},
                                     "workload": {"seq_len": 131072, "dtype": "bfloat16"}})

    a100 = clusters.load("loongtrain-a100")
    one, two = predict_spec(spec("ring"), a100), predict_spec(spec("ring", nodes=2), a100)
    assert one.compute_ms == two.compute_ms and two.attention_ms > one.attention_ms
    gqa = predict_spec(spec("ring", kv=8), a100)
    assert (gqa.bytes_intra + gqa.bytes_inter) * 4 == one.bytes_intra + one.bytes_inter
