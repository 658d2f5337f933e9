"""The tuning space: every registered algorithm x its options x layout; invalid ones explained."""

from __future__ import annotations

from seqpar import algorithms
from seqpar.sweeps.tune import divisors, option_space, tuning_plan


def test_tuning_space_covers_every_algorithm_and_layout():
    plan = tuning_plan(4, "tiny", 1024)
    assert plan.experiment == "tune"
    algos = {p.spec.plan.algorithm for p in plan.trials}
    assert algos == set(algorithms.REGISTRY) - {"local"}
    assert {p.spec.plan.layout for p in plan.trials} == {"contiguous", "zigzag", "stripe"}
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
