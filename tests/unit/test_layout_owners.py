"""`layouts.owners` (every token's rank at once) is what `layouts.positions` deals rank by rank, and
`kernel.same_deal` (two layouts' owners token by token) what comparing each rank's stretches says."""

from __future__ import annotations

import math

import numpy as np
import pytest

from seqpar.planner import kernel
from seqpar.rules import layouts

WORLDS = [*range(1, 17), 24, 100, 256]


def _by_rank(layout: str, world: int, n: int) -> np.ndarray:
    out = np.full(n, -1)
    for r in range(world):
        out[list(layouts.positions(layout, r, world, n))] = r
    return out


@pytest.mark.parametrize("layout", layouts.LAYOUTS)
def test_owners_are_what_positions_deal(layout):
    checked = 0
    for world in WORLDS:
        base = layouts.chunk_count(layout, world)
        for n in {base * kernel.PROXY, base * 3 + world, base * 5}:
            try:
                layouts.check_seq_len(layout, world, n)
            except Exception:  # a length this layout does not take
                continue
            assert (layouts.owners(layout, world, n) == _by_rank(layout, world, n)).all()
            checked += 1
    assert checked >= len(WORLDS)


def _stretches(layout: str, world: int, rank: int, scale: int) -> list[tuple[int, int]]:
    """A rank's proxy tokens as runs [start, end), on a grid `scale` times finer."""
    runs: list[list[int]] = []
    n = layouts.chunk_count(layout, world) * kernel.PROXY
    for t in layouts.positions(layout, rank, world, n):
        if runs and runs[-1][1] == t:
            runs[-1][1] = t + 1
        else:
            runs.append([t, t + 1])
    return [(s * scale, e * scale) for s, e in runs]


def test_same_deal_is_every_rank_holding_the_same_stretches():
    same = 0
    for world in WORLDS:
        for a in layouts.LAYOUTS:
            for b in layouts.LAYOUTS:
                na, nb = (layouts.chunk_count(x, world) * kernel.PROXY for x in (a, b))
                scale = math.lcm(na, nb)
                want = all(_stretches(a, world, r, scale // na)
                           == _stretches(b, world, r, scale // nb) for r in range(world))
                assert kernel.same_deal(a, b, world) == want, (a, b, world)
                same += want and a != b
    assert same > 0  # balanced deals as zigzag at some worlds, contiguous as stripe at P = 1
