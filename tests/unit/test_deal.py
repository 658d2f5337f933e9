"""The deal of a step's sequences (rules/deal.py, rules/packing.py): what every deal keeps, its gap
to its lower bound on lognormal draws at P = 8 to 1,024, the dynamic policy against the static one
on a long tail, the cost of equal micro-batch counts, and the packing rules against plain scans."""

from __future__ import annotations

import random

import pytest

from seqpar.rules import packing
from seqpar.rules.cost_model import CostModel
from seqpar.rules.deal import deal
from seqpar.rules.lengths import draw_batches, parse
from seqpar.rules.pool import pool_sizes, smallest_size

LONG_TAIL = "lognormal:mean=1024,sigma=1.5,min=128,max=8192"
# the planner's rates for a 1.3B decoder on H100s (perf.lengths.deal_cost, rounded): attention
# per visible pair, the rest per token, a ring's K,V per token at each group size, hidden
COST = CostModel(attention=2.6e-13, linear=4.3e-6 / 64, comm=4e-9, overlap=True, half=256.0,
                 comm_at=((2, 2.2e-9), (4, 3.3e-9), (8, 4.0e-9)))


def draw(spec: str, tokens: int, seed: int, longest: int = 8192) -> list[int]:
    return [s.length for s in draw_batches(parse(spec), tokens, longest, seed, 1)[0]]


def check_deal(d, lengths: list[int], capacity: int) -> None:
    """Every sequence once; every micro-batch within its group's capacity; dynamic groups the
    smallest that holds; the free schedule never beats the lower bound."""
    seen = sorted(i for m in d.micro for i in m.seqs)
    assert seen == list(range(len(lengths)))
    for m in d.micro:
        assert sum(lengths[i] for i in m.seqs) <= m.size * capacity
        if d.policy == "dynamic":
            for i in m.seqs:
                assert m.size == smallest_size(lengths[i], capacity, pool_sizes(d.pool))
    assert d.makespan >= d.lower_bound * (1 - 1e-12)
    assert d.round_makespan >= d.makespan * (1 - 1e-12)
    if d.equal_counts or d.policy == "static":
        assert len(set(d.counts)) == 1
        for r in range(d.pool):  # each rank runs one micro-batch a round, rounds in order
            assert [m.round for m in d.of_rank(r)] == list(range(d.counts[r]))


@pytest.mark.parametrize("pool", [8, 64, 1024])
def test_the_dynamic_deal_is_within_two_percent_of_its_lower_bound(pool):
    seed = random.randrange(100)
    lengths = draw(LONG_TAIL, 4 * pool * 2048, seed)
    d = deal(lengths, pool, 2048, "dynamic", COST, ranks_per_node=4)
    check_deal(d, lengths, 2048)
    assert 1.0 <= d.gap < 1.02, (pool, seed, d.gap)
    assert d.imbalance < 1.03
    assert set(d.degrees) == {1, 2, 4}  # 8,192 tokens need 4 x 2,048


def test_dynamic_beats_static_on_a_long_tail():
    seed = random.randrange(100)
    lengths = draw(LONG_TAIL, 16 * 2048 * 4, seed)
    dynamic = deal(lengths, 16, 2048, "dynamic", COST, ranks_per_node=4)
    statics = [deal(lengths, 16, 2048, "static", COST, degree=g, packing=p, ranks_per_node=4)
               for g in (4, 8, 16) for p in ("best-fit", "cost-balanced")]
    for s in statics:
        check_deal(s, lengths, 2048)
    best = min(s.makespan for s in statics)
    # every short sequence pays a static group's communication; the dynamic deal runs it alone
    assert dynamic.makespan < 0.97 * best, (seed, dynamic.makespan, best)
    # with one sequence length the two are one: every sequence on one rank, no communication
    fixed = draw("fixed:1024", 16 * 2048 * 4, 0)
    a = deal(fixed, 16, 1024, "dynamic", COST)
    b = deal(fixed, 16, 1024, "static", COST, degree=1)
    assert a.makespan == pytest.approx(b.makespan) and set(a.degrees) == {1}


def test_equal_counts_cost_rounds_and_keep_the_groups():
    seed = random.randrange(100)
    lengths = draw(LONG_TAIL, 8 * 2048 * 4, seed)
    free = deal(lengths, 8, 2048, "dynamic", COST, ranks_per_node=4)
    equal = deal(lengths, 8, 2048, "dynamic", COST, equal_counts=True, ranks_per_node=4)
    check_deal(equal, lengths, 2048)
    # the same micro-batches (groups and packs), only placed in rounds
    key = sorted((m.group, m.seqs) for m in free.micro if m.seqs)
    assert sorted((m.group, m.seqs) for m in equal.micro if m.seqs) == key
    assert equal.makespan == pytest.approx(free.makespan)  # the free schedule is unchanged
    cost = equal.round_makespan / free.makespan
    assert 1.0 < cost < 1.6, cost  # benchmarks/deal_gap.py: 1.18-1.34 at P = 8 to 1,024


def test_the_lower_bound_holds_under_overlap_and_fixed_costs():
    rng = random.Random()
    for _ in range(40):
        pool = rng.choice([2, 3, 4, 8])
        cost = CostModel(attention=rng.uniform(1e-10, 1e-8), linear=rng.uniform(0, 1e-5),
                         comm=rng.uniform(0, 1e-5), overlap=rng.random() < 0.5,
                         half=rng.choice([0.0, 96.0]), fixed=rng.choice([0.0, 1e-3]))
        lengths = draw("lognormal:mean=40,sigma=1.2,min=2,max=200", rng.choice([300, 2000]),
                       rng.randrange(99), longest=200)
        policy = rng.choice(["static", "dynamic"])
        extra = ({"degree": pool, "packing": rng.choice(["best-fit", "cost-balanced"])}
                 if policy == "static" else {"equal_counts": rng.random() < 0.3})
        check_deal(deal(lengths, pool, 100, policy, cost, **extra), lengths, 100)


def test_cost_model_terms():
    plain = CostModel(attention=1e-9, linear=1e-6, comm=1e-6)
    n = [100, 300]
    pairs = 100 * 101 // 2 + 300 * 301 // 2
    assert plain.seconds(n, 4) == pytest.approx(1e-9 * pairs / 4 + 1e-6 * 400 / 4 + 1e-6 * 400 * 3 / 4)
    hidden = CostModel(attention=1e-9, linear=1e-6, comm=1e-6, overlap=True)
    assert hidden.seconds(n, 4) == pytest.approx(max(1e-9 * pairs / 4, 1e-6 * 400 * 3 / 4)
                                                 + 1e-6 * 400 / 4)
    sized = CostModel(attention=1e-9, comm=1e-6, comm_at=((4, 5e-6),), half=50.0, fixed=0.1)
    assert sized.comm_of(4) == 5e-6 and sized.comm_of(2) == 1e-6 / 2 and sized.comm_of(1) == 0
    assert sized.seconds([100], 2) == pytest.approx(
        1e-9 * 5050 * (1 + 50 * 2 / 100) / 2 + 1e-6 / 2 * 100 + 0.1)
    assert CostModel(window=10).pairs(100) == 55 + 90 * 10


def _best_fit_scan(order, lengths, room):
    bins, left = [], []
    for i in order:
        fits = [b for b in range(len(bins)) if left[b] >= lengths[i]]
        if fits:
            b = min(fits, key=lambda k: (left[k], k))
            bins[b].append(i)
            left[b] -= lengths[i]
        else:
            bins.append([i])
            left.append(room - lengths[i])
    return bins


def _balanced_scan(order, lengths, work, room, count):
    bins, load, left = [[] for _ in range(count)], [0.0] * count, [room] * count
    for i in order:
        fits = [b for b in range(len(bins)) if left[b] >= lengths[i]]
        if not fits:
            bins.append([])
            load.append(0.0)
            left.append(room)
            fits = [len(bins) - 1]
        b = min(fits, key=lambda k: (load[k], k))
        bins[b].append(i)
        load[b] += work[i]
        left[b] -= lengths[i]
    return [b for b in bins if b]


def test_packing_keeps_the_scans_rules_ties_included():
    rng = random.Random()
    for _ in range(30):
        lengths = [rng.choice([1, 2, 3, 5, 8, 13, 40]) for _ in range(rng.randrange(1, 200))]
        room = rng.choice([40, 64, 100])
        order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
        assert packing.best_fit(order, lengths, room) == _best_fit_scan(order, lengths, room)
        work = [float(n * n) for n in lengths]
        count = rng.randrange(1, 8)
        assert (packing.balanced(order, lengths, work, room, count)
                == _balanced_scan(order, lengths, work, room, count))
        packs = packing.best_fit(order, lengths, room)
        dp = rng.choice([2, 3, 4])
        split = packing.split_to_multiple(packs, dp, lengths)
        assert sorted(i for p in split for i in p) == sorted(range(len(lengths)))
        assert len(split) % dp == 0 or all(len(p) == 1 for p in split)


def test_degrees_by_cost_never_lose_to_the_smallest_nor_any_size_to_powers_of_two():
    """In the deal's own model: `degrees: cost` keeps the smallest-fit deal as a candidate, and
    any size by cost the powers of two by cost; its lower bound stays below its makespan; and on
    some step it wins (a long sequence spread wider)."""
    cost = CostModel(attention=2e-12, linear=4e-8, comm=1e-9, fixed=2e-3, overlap=True)
    gains = []
    for seed in range(60):
        r = random.Random(seed)
        pool, cap = r.choice([1, 2, 3, 4, 8, 12, 64, 1024]), r.choice([512, 2048])
        lengths = [min(pool * cap, max(1, int(r.lognormvariate(6.5, 1.4))))
                   for _ in range(r.randint(1, 30))]
        by = {}
        for any_size in (False, True):
            small = deal(lengths, pool, cap, "dynamic", cost, any_size=any_size)
            by[any_size] = wide = deal(lengths, pool, cap, "dynamic", cost, any_size=any_size,
                                       degrees="cost")
            assert wide.makespan <= small.makespan * (1 + 1e-9)
            assert wide.lower_bound <= wide.makespan * (1 + 1e-9)
            assert sorted(i for m in wide.micro for i in m.seqs) == list(range(len(lengths)))
            gains.append(small.makespan / wide.makespan)
        assert by[True].makespan <= by[False].makespan * (1 + 1e-9)
    assert max(gains) > 1.05


def test_degrees_refuse_an_unknown_rule_and_a_static_policy():
    from seqpar.errors import ConfigError

    with pytest.raises(ConfigError, match="degrees"):
        deal([100, 200], 2, 256, "dynamic", CostModel(), degrees="widest")
    with pytest.raises(ConfigError, match="degrees"):
        deal([100, 200], 2, 256, "static", CostModel(), degree=2, degrees="cost")


def test_a_milp_bounds_the_greedy_sizes_and_its_sizes_deal():
    """planner.degrees: HiGHS over each sequence's group on a small step: its proven bound is
    below every deal's makespan, and its sizes deal through the same list scheduler."""
    from seqpar.errors import ConfigError
    from seqpar.planner.degrees import solve

    cost = CostModel(attention=2e-12, linear=4e-8, comm=1e-9, fixed=2e-3, overlap=True)
    lengths = [900, 300, 120, 700, 64, 1500, 200, 40]
    sizes, bound, _ = solve(lengths, 4, 512, cost, time_limit=20)
    assert sizes is not None and all(d * 512 >= n for d, n in zip(sizes, lengths, strict=True))
    exact = deal(lengths, 4, 512, "dynamic", cost, sizes=sizes)
    for d in (exact, deal(lengths, 4, 512, "dynamic", cost),
              deal(lengths, 4, 512, "dynamic", cost, degrees="cost")):
        assert bound <= d.makespan * (1 + 1e-9)
    with pytest.raises(ConfigError, match="sizes"):
        deal(lengths, 4, 512, "dynamic", cost, sizes=[1] * len(lengths))
