"""Transfer skipping on the ring schedule (rules/route.py), simulated without processes: every
position's plan is run step by step, and each message one position sends must be the one its
receiver posts in the same step; every block must be at each position that needs it when it needs
it; every gradient must visit exactly the block's readers and arrive home; `need=None` must be the
unskipped schedule message for message; and `layouts.sees` must agree with `block_tasks`."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from seqpar.algorithms import layouts
from seqpar.algorithms.base import AttnShape, Mask
from seqpar.algorithms.layouts import Relation
from seqpar.rules import route


def random_need(size: int, rng: random.Random, density: float) -> route.Need:
    return tuple(tuple(rng.random() < density for _ in range(size)) for _ in range(size))


def simulate(size: int, inner: int, need: route.Need | None) -> None:
    """Run every position's plan; assert agreement, delivery, gradient paths and home."""
    plans = [route.plan(size, inner, p, need) for p in range(size)]
    steps = plans[0].steps
    assert all(pl.steps == steps for pl in plans)
    outer = size // inner

    def nxt(p: int) -> int:
        i, t = divmod(p, inner)
        return i * inner + (t + 1) % inner

    def nxt_outer(p: int) -> int:
        i, t = divmod(p, inner)
        return ((i + 1) % outer) * inner + t

    def source(p: int, g: int) -> int:
        o, s = divmod(g, inner)
        i, t = divmod(p, inner)
        return ((i - o) % outer) * inner + (t - s) % inner

    holding = {p: p for p in range(size)}  # position -> block it holds at the current step
    carried: dict[int, list[int]] = {b: [] for b in range(size)}  # block -> readers its grad saw
    in_flight: dict[tuple[int, int], tuple[int, int]] = {}  # (to, consumed at) -> (block, step)
    starts = dict(holding)  # what each position held at the start of the current outer step
    for g in range(steps):
        o, s = divmod(g, inner)
        if s == 0 and o > 0:  # the prefetches of outer step o - 1 have landed
            sent = {nxt_outer(p): starts[p] for p in range(size)
                    if plans[p].fetch_send[o - 1]}
            got = {p for p in range(size) if plans[p].fetch_recv[o - 1]}
            assert set(sent) == got, (g, sent, got)
            holding = {p: sent.get(p) for p in range(size)}
        if s == 0:
            starts = dict(holding)
        for p, pl in enumerate(plans):
            want = need is None or need[p][source(p, g)]
            assert pl.needed[g] == want
            assert pl.held[g] == (holding[p] is not None)
            if pl.held[g]:
                assert holding[p] == source(p, g)
            if want:  # the block is here when this position needs it
                assert holding[p] == source(p, g)
                b = holding[p]
                carried[b].append(p)
                if carried[b][:-1]:  # the gradient arrives from the previous reader
                    assert in_flight.pop((p, g)) == (b, g)
        for p, pl in enumerate(plans):  # gradients sent after step g
            if pl.grad_to[g] is not None:
                to, _ = pl.grad_to[g]
                b = holding[p]
                expected = [f for f in plans[to].grad_from[g] if f[0] == p]
                assert len(expected) == 1, (g, p, to)
                at = expected[0][1]
                in_flight[(to, at)] = (b, at if at != route.HOME else route.HOME)
                if at == route.HOME:
                    assert to == b
            for frm, _, _ in pl.grad_from[g]:
                assert plans[frm].grad_to[g][0] == p
        if s < inner - 1:  # inner hops after step g
            sent = {nxt(p): holding[p] for p in range(size) if plans[p].hop_send[g]}
            got = {p for p in range(size) if plans[p].hop_recv[g]}
            assert set(sent) == got, (g, sent, got)
            holding = {p: sent.get(p) for p in range(size)}
    for b in range(size):  # every gradient came home once, or stayed home, or none was made
        readers = [p for g in range(size) for p in range(size)
                   if (need is None or need[p][b]) and source(p, g) == b]
        assert carried[b] == readers
        home = plans[b].home
        if not readers:
            assert home == "none"
        elif readers == [b]:
            assert home == "kept"
        else:
            assert home == "arrives" and in_flight.pop((b, route.HOME)) == (b, route.HOME)
    assert not in_flight


@pytest.mark.parametrize(("size", "inner"), [(1, 1), (2, 2), (3, 3), (4, 4), (4, 2), (8, 8),
                                             (8, 2), (8, 4), (6, 3), (6, 2)])
def test_random_needs_route_consistently(size, inner):
    rng = random.Random(size * 31 + inner)
    for density in (0.0, 0.2, 0.5, 0.8, 1.0):
        for _ in range(8):
            simulate(size, inner, random_need(size, rng, density))
    simulate(size, inner, None)


@pytest.mark.parametrize(("size", "inner"), [(4, 4), (8, 2), (8, 4), (6, 3)])
def test_unskipped_route_is_the_ring(size, inner):
    """need=None: every hop, every prefetch, the gradient one hop at a time (diagonal after an
    inner ring's last step), size - 1 block and size gradient messages per position."""
    for p in range(size):
        pl = route.plan(size, inner, p, None)
        full = route.plan(size, inner, p, tuple((True,) * size for _ in range(size)))
        assert pl == full
        assert pl.steps == size and all(pl.held) and all(pl.needed)
        assert pl.hop_send == tuple(g % inner < inner - 1 for g in range(size))
        assert pl.fetch_send == tuple(o < size // inner - 1 for o in range(size // inner))
        assert (pl.kv_messages, pl.grad_messages) == (size - 1, size)
        for g, (to, via_inner) in enumerate(pl.grad_to):
            assert via_inner == (g % inner < inner - 1)
            i, t = divmod(p, inner)
            diag = (((i + 1) % (size // inner)) * inner + (t + 1) % inner)
            assert to == (i * inner + (t + 1) % inner if via_inner else diag)


def test_contiguous_window_ends_the_ring_early():
    """Contiguous, P = 4, window within one neighbour: two steps, one hop per block (the last
    none), gradients home directly."""
    shape = AttnShape(1, 64, 2, 2, 4)
    need = Mask.of(shape, 4, "contiguous", True, None, 8).need(4)
    assert need == tuple(tuple(k in (q - 1, q) for k in range(4)) for q in range(4))
    plans = [route.plan(4, 4, p, need) for p in range(4)]
    assert [pl.steps for pl in plans] == [2] * 4
    assert [pl.kv_messages for pl in plans] == [1, 1, 1, 0]
    assert [pl.grad_messages for pl in plans] == [1, 2, 2, 1]
    assert plans[1].grad_to[1] == (0, False)  # block 0's dK,dV: home from rank 1, one hop


def test_plain_causal_contiguous_blocks_stop_at_the_last_rank():
    """Causal contiguous without window: block b is read by ranks b..P-1, so it travels P-1-b hops
    (no block wraps round to rank 0)."""
    need = layouts.layout_need("contiguous", 4, 16, Relation(True))
    assert [route.plan(4, 4, p, need).kv_messages for p in range(4)] == [1, 2, 3, 0]


@pytest.mark.parametrize("layout", layouts.LAYOUTS)
def test_sees_agrees_with_block_tasks(layout):
    n, world = 48, 4
    cus = [None, (0, 5, 6, 40, 48), (0, 24, 48)]
    for causal, cu, window in itertools.product((True, False), cus, (None, 1, 3, 7, 20)):
        rel = Relation(causal, cu, window)
        pos = [layouts.positions(layout, r, world, n, cu) for r in range(world)]
        for a, b in itertools.product(range(world), repeat=2):
            tasks = layouts.block_tasks(pos[a], pos[b], rel)
            assert layouts.sees(pos[a], pos[b], rel) == bool(tasks), (rel, a, b)
    assert not layouts.sees(torch.tensor([3]), torch.tensor([5, 9]), Relation(True))


OPTIONS = {"usp": {"dhp": 2}, "double_ring": {"inner_ring": 2}, "wallfacer": {"team_size": 2},
           "burst": {"ranks_per_node": 2}}


@pytest.mark.parametrize("name", ["allgather", "ulysses", "ring", "usp", "double_ring",
                                  "wallfacer", "burst"])
def test_skipped_bytes_are_part_of_the_unskipped_count(name):
    """For every algorithm: skip off, or a mask that hides nothing, skips 0 bytes; with it on,
    each rank's net count plus its skipped bytes is its unskipped count, and only the ring-based
    algorithms skip at all (a contiguous window of one token hides every other block)."""
    from seqpar import algorithms

    shape = AttnShape(1, 64, 4, 2, 4)
    opts = OPTIONS.get(name, {})
    spec = algorithms.get(name)
    world = 4
    full = algorithms.expected_bytes(name, shape, world, **opts)
    off = {**opts, "skip_transfers": False}
    for layout, window, cu in itertools.product(layouts.LAYOUTS, (None, 1, 8),
                                                (None, (0, 10, 40, 64))):
        mask = dict(layout=layout, window=window, cu_seqlens=cu)
        assert algorithms.expected_bytes(name, shape, world, **mask, **off) == full
        assert algorithms.skipped_bytes(name, shape, world, **mask, **off) == {
            "forward": 0, "backward": 0}
        if window is None and cu is None:  # plain: the default moves the paper's bytes
            assert algorithms.expected_bytes(name, shape, world, **mask, **opts) == full
        on = {**opts, "skip_transfers": True}
        m = Mask.of(shape, world, layout, True, cu, window)
        for r in range(world):
            net = spec.bytes_of_rank(shape, world, on, r, m)
            skipped = spec.skipped_of_rank(shape, world, on, r, m)
            whole = spec.bytes_of_rank(shape, world, on, r)
            assert all(net[p] + skipped[p] == whole[p] and skipped[p] >= 0 for p in net)
    one = algorithms.skipped_bytes(name, shape, world, layout="contiguous", window=1,
                                   skip_transfers=True, **opts)
    assert (sum(one.values()) > 0) == (name in ("ring", "usp", "double_ring", "burst"))
