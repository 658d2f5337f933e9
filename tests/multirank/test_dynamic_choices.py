"""Dynamic SP's second step is exact in float64: group sizes chosen by cost (`plan.degrees: cost`)
and the algorithm chosen per group size (`plan.algorithm: auto`) train the step the one-process
model trains, loss and every gradient, at P = 2, 3, 4 and 8, MHA and GQA. The deal and the choice
are made on the driver as a sweep makes them (`experiments.steps.make_case`)."""

from __future__ import annotations

import pytest

from seqpar.errors import ConfigError
from seqpar.experiments.steps import make_case
from seqpar.workers import step_check

CAPACITY = 6


def shape(world: int, gqa: bool) -> tuple[tuple[str, int], ...]:
    heads = 6 if world == 3 else 8 if world == 8 else 4
    kv = (3 if world == 3 else 2) if gqa else heads
    return (("vocab", 61), ("heads", heads), ("kv_heads", kv), ("hidden", 8 * heads), ("ffn", 48))


def case_of(algorithm: str, world: int, gqa: bool, seed: int, degrees: str = "smallest",
            any_size: bool = False):
    return make_case(algorithm, world,
                     f"lognormal:mean=9,sigma=1.0,min=2,max={CAPACITY * world}",
                     tokens=20 * world, capacity=CAPACITY, policy="dynamic", seed=seed % 1000,
                     overrides=shape(world, gqa), longest=CAPACITY * world, degrees=degrees,
                     any_size=any_size)


# (algorithm, degrees, world, gqa): every world and both head layouts met, auto and cost apart
# and together
# make test: a fixed algorithm and auto, both degree rules, GQA and MHA, P = 2, 3 and 4; the rest
# (P = 8: 8 ranks on 2 cores) make test-full's
DESIGN = [("auto", "smallest", 2, False),
          ("ring", "cost", 3, True), ("auto", "cost", 4, True),
          pytest.param("auto", "smallest", 8, True, marks=pytest.mark.slow),
          pytest.param("ulysses", "cost", 2, True, marks=pytest.mark.slow),
          pytest.param("auto", "cost", 3, False, marks=pytest.mark.slow)]


@pytest.mark.multirank
@pytest.mark.parametrize(("algorithm", "degrees", "world", "gqa"), DESIGN)
def test_the_choices_train_the_one_process_step(gang, seed, algorithm, degrees, world, gqa):
    case = case_of(algorithm, world, gqa, seed, degrees)
    sizes = {m.size for b in case.batches for m in b.deal.micro if m.seqs}
    assert len(sizes) > 1 or degrees == "cost", sizes
    if algorithm == "auto":
        chosen = {d: name for d, name, _ in case.algorithms_by_size}
        assert set(chosen) >= sizes and chosen.get(1, "local") == "local"
        assert {case.options_at(d)[0] for d in sizes} == {chosen[d] for d in sizes}
    got = step_check.compare(case, gang.run(step_check.rank_run, case), step_check.reference(case))
    assert got.ok, f"{case.label()}: {got.failures}"


def test_auto_and_cost_refuse_what_they_cannot_run():
    with pytest.raises(ConfigError, match="dynamic"):
        make_case("auto", 2, "fixed:8", tokens=16, capacity=8, policy="static").validate()
    with pytest.raises(ConfigError, match="degrees"):
        make_case("ring", 2, "fixed:8", tokens=16, capacity=8, policy="dynamic",
                  degrees="widest")
