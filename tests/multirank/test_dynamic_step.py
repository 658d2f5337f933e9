"""A training step of variable-length sequences under every SP policy equals the one-process model
in float64: the loss and every gradient, for every algorithm as the group attention (a group of one
runs `local`), at P = 2, 3 (a pool that is not a power of two), 4 and 8, MHA and GQA.

The step is the runner's own (`model.step.train_step` on the pool built by `build_pool`, the deal
made by `rules.deal`); the reference trains one process on the same sequences one at a time. `make
test` runs a covering design: each algorithm once, the policies by turns, the pool size through 2,
3, 4 and 8 and MHA/GQA alternating, with FSDP over the pool (equal counts), cost-balanced packing,
DP = 2 and a window each met (`COVERING`); `make test-full` runs the full product (7 x 2 x 4 x 2)
and ZeRO-1 under both policies. Disjoint
groups run at the same time: a test holds two groups' micro-batches to overlapping in wall time.
"""

from __future__ import annotations

import pytest

from seqpar.experiments.steps import make_case
from seqpar.workers import step_check
from tests.resources import FULL

ALGORITHMS = ("allgather", "ulysses", "ring", "usp", "double_ring", "wallfacer", "burst")
POLICIES = ("static", "dynamic")
WORLDS = (2, 3, 4, 8)
OPTIONS = {"usp": {"dhp": 2}, "double_ring": {"inner_ring": 2}, "wallfacer": {"team_size": 2}}
LAYOUTS = ("zigzag", "stripe", "contiguous")
CAPACITY = 6  # tokens a rank: sequences up to 6 x P need groups of every size


def shape(world: int, gqa: bool) -> tuple[tuple[str, int], ...]:
    heads = 6 if world == 3 else 8 if world == 8 else 4
    kv = (3 if world == 3 else 2) if gqa else heads
    return (("vocab", 61), ("heads", heads), ("kv_heads", kv), ("hidden", 8 * heads), ("ffn", 48))


def build(algorithm: str, world: int, policy: str, gqa: bool, k: int, seed: int):
    """Case k of the design: its layout rotates; every third one FSDP over the pool (equal
    counts; at P = 8, 8 ranks on 2 cores, in make test-full only), cost-balanced packing on odd
    static ones, DP = 2 on one static in four (P > 2), a window on one case in five."""
    fsdp = k % 3 == 0 and (FULL or world <= 4)
    dp = 2 if policy == "static" and world % 2 == 0 and world > 2 and k % 4 == 1 else 1
    return make_case(
        algorithm, world, f"lognormal:mean=9,sigma=1.0,min=2,max={CAPACITY * world // dp}",
        tokens=20 * world, capacity=CAPACITY, policy=policy, seed=seed % 1000,
        layout=LAYOUTS[k % 3], states="fsdp" if fsdp else "replicated", equal_counts=fsdp,
        packing="cost-balanced" if policy == "static" and k % 2 else "best-fit", dp=dp,
        window=5 if k % 5 == 2 else None, options=OPTIONS.get(algorithm),
        overrides=shape(world, gqa), longest=CAPACITY * world // dp)


# make test: each algorithm once (its case index k the row's), the policies by turns, the pool
# through P = 2, 3, 4 and 8 once, MHA/GQA alternating; rows 0, 3 and 6 FSDP, 1 and 5 DP = 2 with
# cost-balanced packing (3 too), 2 a window (`build`); test_the_design_meets_every_feature holds it
COVERING = (("allgather", "dynamic", 2, False), ("ulysses", "static", 4, True),
            ("ring", "dynamic", 8, True), ("usp", "static", 3, False),
            ("double_ring", "dynamic", 4, True), ("wallfacer", "static", 4, False),
            ("burst", "dynamic", 3, True))


def design() -> list[tuple[str, str, int, bool, int]]:
    """(algorithm, policy, P, GQA, case index k): the full product under SEQPAR_TEST_FULL, else
    the covering rows."""
    if FULL:
        return [(a, p, w, g, ALGORITHMS.index(a) + 2 * POLICIES.index(p) + WORLDS.index(w))
                for a in ALGORITHMS for p in POLICIES for w in WORLDS for g in (False, True)]
    return [(*row, k) for k, row in enumerate(COVERING)]


def test_the_design_meets_every_feature():
    rows = design()
    cases = [build(a, w, p, g, k, seed=1) for a, p, w, g, k in rows]
    assert {r[0] for r in rows} == set(ALGORITHMS) and {r[1] for r in rows} == set(POLICIES)
    assert {r[2] for r in rows} == set(WORLDS) and {r[3] for r in rows} == {False, True}
    assert {c.layout for c in cases} == set(LAYOUTS)
    assert any(c.states == "fsdp" for c in cases) and any(c.dp == 2 for c in cases)
    assert any(c.window for c in cases) and any(c.packing == "cost-balanced" for c in cases)


@pytest.mark.multirank
@pytest.mark.parametrize(("algorithm", "policy", "world", "gqa", "k"), design())
def test_step_matches_one_process(gang, seed, algorithm, policy, world, gqa, k):
    case = build(algorithm, world, policy, gqa, k, seed)
    if policy == "dynamic":  # the deal uses groups of more than one size, larger than one rank
        sizes = {m.size for b in case.batches for m in b.deal.micro if m.seqs}
        assert len(sizes) > 1 and max(sizes) > 1, sizes
    got = step_check.compare(case, gang.run(step_check.rank_run, case), step_check.reference(case))
    assert got.ok, f"{case.label()}: {got.failures}"


@pytest.mark.multirank
def test_groups_of_any_size_match_one_process(gang, seed):
    """ByteScale's groups of any size (plan.group_sizes: any): a group of 3 in a pool of 4."""
    for offset in range(64):  # some draws deal no group of 3: take the first from `seed` on that does
        case = make_case("ring", 4, "lognormal:mean=14,sigma=0.4,min=2,max=24", tokens=80,
                         capacity=6, policy="dynamic", seed=(seed + offset) % 1000, any_size=True,
                         overrides=shape(4, True), longest=24)
        if 3 in {m.size for b in case.batches for m in b.deal.micro if m.seqs}:
            break
    assert 3 in {m.size for b in case.batches for m in b.deal.micro if m.seqs}, seed
    got = step_check.compare(case, gang.run(step_check.rank_run, case), step_check.reference(case))
    assert got.ok, got.failures


@pytest.mark.multirank
def test_disjoint_groups_run_at_the_same_time(gang, seed):
    """Two groups of two ranks each run their micro-batches at once: the intervals overlap in
    wall time (one host: one clock). A policy that ran the groups one after another fails."""
    case = make_case("ring", 4, "fixed:12", tokens=96, capacity=6, policy="dynamic", seed=seed,
                     overrides=shape(4, False), longest=12)
    runs = [r for r in gang.run(step_check.rank_timeline, case) if r is not None]
    spans = {}
    for rank_spans in runs:
        for group, start, end in rank_spans:
            spans.setdefault(group, []).append((start, end))
    a, b = spans[(0, 1)], spans[(2, 3)]
    overlap = min(max(e for _, e in a), max(e for _, e in b)) - max(min(s for s, _ in a),
                                                                     min(s for s, _ in b))
    assert overlap > 0.5 * min(max(e for _, e in a) - min(s for s, _ in a),
                               max(e for _, e in b) - min(s for s, _ in b)), spans


@pytest.mark.multirank
@pytest.mark.parametrize("policy", ["static", pytest.param("dynamic", marks=pytest.mark.slow)])
def test_zero1_steps_as_replicated_states_do_and_holds_its_share_of_the_moments(gang, seed, policy):
    """ZeRO-1 (`train.states: zero1`, the optimizer's moments sharded over the pool) on a pool of
    3 (a partition that is not even): after an optimizer step on each of two batches every rank
    holds the parameters replicated states reach, and AdamW's moments of its share only."""
    from seqpar.rules.memory import zero1_partition

    cases = {states: make_case("ring", 3, "lognormal:mean=9,sigma=1.0,min=2,max=18", tokens=60,
                               capacity=CAPACITY, policy=policy, seed=seed % 1000, batches=2,
                               states=states, overrides=shape(3, True), longest=18)
             for states in ("replicated", "zero1")}
    (want, whole), *_ = gang.run(step_check.rank_trained, cases["replicated"])
    share = zero1_partition(cases["zero1"].config(), 3)
    for rank, got in enumerate(r for r in gang.run(step_check.rank_trained, cases["zero1"])
                               if r is not None):
        params, held = got
        moved = max((params[k] - want[k]).abs().max().item() for k in want)
        assert moved < 1e-12, (rank, moved)
        # replicated: params, grads, two moments of every element (float64) and AdamW's 4-byte
        # step count of every parameter; zero1: the moments and counts of its share only
        steps = held - (whole - 2 * 8 * sum(share) - 4 * len(want)) - 2 * 8 * share[rank]
        assert 0 < steps < 4 * len(want) and steps % 4 == 0, (rank, held, whole, share)
