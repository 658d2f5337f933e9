"""The search's shortcuts decide what the long way decides: a configuration's ceiling is never
below its exact bound (dense and MoE models, GPUs and a CPU host whose ranks share cores), the
frontier hands configurations out in the order a full sort by exact bound gives, and `pareto`
keeps, groups and points to what a row-by-row comparison does; the collector paused through a
search is left as it was, objects a process froze still frozen."""

from __future__ import annotations

import gc
import random

import numpy as np
import pytest

from seqpar.errors import ConfigError
from seqpar.planner import clusters
from seqpar.planner import ep as ep_mod
from seqpar.planner.bound import Frontier, ceiling, exact
from seqpar.planner.dominance import pareto
from seqpar.planner.gcpause import gc_paused
from seqpar.planner.policy import Filters, space
from seqpar.planner.search import attention_space, make_setup, splits

RNG = random.Random()


def _policies(setup, dp, sp):
    eps = ep_mod.degrees(setup.cfg, setup.world, setup.per_node)
    offloadable = setup.cluster.host_link_gb_per_s is not None
    return [p for p in space(Filters(), dp, sp=sp, per_node=setup.per_node, eps=eps)
            if (offloadable or not p.offload) and ep_mod.allowed(p, setup.cfg, setup.world)]


def test_a_ceiling_is_never_below_the_exact_bound():
    cases = [("h100-sxm", "llama3.1-8b", 32, 4, 65536, 16), ("h100-sxm", "tiny-qwen3-moe", 16, 2,
             8192, 32), ("local", "tiny", 4, 1, 1024, 8), ("loongtrain-a100", "llama2-7b", 64, 8,
                                                          131072, 8)]
    checked = 0
    for cluster, model, world, nodes, seq_len, sequences in cases:
        setup = make_setup(clusters.load(cluster), model, seq_len, seq_len * sequences, world,
                           nodes)
        for dp, sp, _ in splits(setup):
            policies = _policies(setup, dp, sp)
            configs = attention_space(sp, Filters())
            for name, options in RNG.sample(configs, min(3, len(configs))):
                layout = RNG.choice(["zigzag", "stripe"]) if sp > 1 else "zigzag"
                try:
                    p = setup.attention(sp, name, dict(options), layout)
                except ConfigError:  # a layout the configuration does not take
                    continue
                assert ceiling(setup, dp, sp, p, policies) >= exact(setup, dp, sp, p, policies)
                checked += 1
    assert checked >= 10


def test_the_frontier_hands_out_what_a_full_sort_by_exact_bound_does():
    for _ in range(50):
        exacts = [float(RNG.choice([1, 2, 3, 4, 5])) for _ in range(RNG.randint(0, 30))]
        tops = [e + RNG.choice([0.0, 0.0, 0.5, 2.0]) for e in exacts]
        asked: list[int] = []

        def bound(i: int, exacts: list[float] = exacts, asked: list[int] = asked) -> float:
            asked.append(i)
            return exacts[i]

        frontier = Frontier(list(zip(tops, range(len(exacts)), strict=True)), bound)
        order = []
        while (got := frontier.pop()) is not None:
            order.append(got)
        assert order == sorted(((e, i) for i, e in enumerate(exacts)), key=lambda x: -x[0])
        assert sorted(asked) == list(range(len(exacts)))  # each taken once
        frontier = Frontier(list(zip(tops, range(len(exacts)), strict=True)), bound)
        first = frontier.pop()
        assert first is None or len(frontier.rest()) == len(exacts) - 1
    lazy = Frontier([(3.0, "a"), (1.0, "b")], None)  # no exact bound: the ceilings are
    assert [lazy.pop(), lazy.pop(), lazy.pop()] == [(3.0, "a"), (1.0, "b"), None]


def _pareto_row_by_row(rows):
    x = np.array([[float(f"{v:.9g}") for v in r] for r in rows])
    keep, same, beaten = [], {}, {}
    for i in range(len(rows)):
        le = (x <= x[i]).all(axis=1)
        eq = (x == x[i]).all(axis=1)
        better = le & ~eq
        if better.any():
            beaten[i] = better
            continue
        if int(np.argmax(eq)) == i:
            keep.append(i)
            same[i] = [int(j) for j in np.flatnonzero(eq) if j != i]
    kept = np.zeros(len(rows), dtype=bool)
    kept[keep] = True
    return keep, same, {i: int(np.argmax(b & kept)) for i, b in beaten.items()}


def test_pareto_decides_as_row_by_row_comparison_does():
    values = [0.0, -0.0, 1.0, 2.0, 1.0000000001, 3.0, float("inf"), float("nan")]
    for _ in range(200):
        m = RNG.randint(1, 6)
        pool = values[:RNG.randint(3, len(values))]
        rows = [tuple(RNG.choice(pool) for _ in range(m)) for _ in range(RNG.randint(1, 40))]
        keep, same, by = pareto(rows)
        want = _pareto_row_by_row(rows)
        assert keep == want[0] and list(by.items()) == list(want[2].items())
        assert {i: [int(j) for j in js] for i, js in same.items()} == want[1]


def test_a_search_pauses_the_collector_and_leaves_it_as_it_was(monkeypatch):
    """Off inside, as it was after (an exception too); on the way out what it built joins the
    oldest generation (freeze, then unfreeze) unless the process froze objects of its own: those
    stay frozen. (Calls are watched, not freeze counts: a frozen object freed by its last
    reference leaves the count at any time.)"""
    seen, calls = [], []
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    monkeypatch.setattr(gc, "unfreeze", lambda: calls.append("unfreeze"))
    frozen = [0]
    monkeypatch.setattr(gc, "get_freeze_count", lambda: frozen[0])

    @gc_paused()
    def inside() -> None:
        seen.append(gc.isenabled())

    for before in (True, False):
        (gc.enable if before else gc.disable)()
        try:
            inside()
            assert seen[-1] is False and gc.isenabled() is before
        finally:
            gc.enable()
    assert calls == ["freeze", "unfreeze"] * 2
    with pytest.raises(ValueError), gc_paused():
        raise ValueError
    assert gc.isenabled() and calls[-2:] == ["freeze", "unfreeze"]
    calls.clear()
    frozen[0] = 12  # a process that froze objects of its own: they stay frozen
    inside()
    assert calls == [] and gc.isenabled()
