"""perf.ring costs a ring's blocks once per kind: that is exact only if every block of a kind costs
the same. Checked here against every (ring, position, source) of every algorithm's rings."""

from __future__ import annotations

import numpy as np
import pytest

from seqpar import algorithms
from seqpar.algorithms.base import AttnShape
from seqpar.algorithms.layouts import LAYOUTS
from seqpar.errors import ConfigError
from seqpar.planner import clusters
from seqpar.planner.predict import Job
from seqpar.planner.ring import sources
from seqpar.planner.schedule import RingStage, schedule
from seqpar.rules.groups import NestedRing


def _kind(st: RingStage, r: int, pos: int, src: int) -> tuple:
    if st.keys is None:
        return (int(np.sign(src - pos)),)
    here, there = st.keys[0][r][pos], st.keys[1][r][src]
    return tuple(int(np.sign(b - a)) for a, b in zip(here, there, strict=True))


@pytest.mark.parametrize("world", [8, 16])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_block_of_a_kind_costs_the_same(world, layout):
    a100 = clusters.load("loongtrain-a100")
    shape = AttnShape(1, 64 * world, 32, 8, 128, 2)
    checked = 0
    for name in algorithms.REGISTRY:
        for options in algorithms.option_space(name, world):
            try:
                algorithms.check(name, shape, world, layout, True, **options)
            except ConfigError:
                continue
            job = Job(a100, shape, world, 2, layout, True, "bfloat16")
            for stages in schedule(name, shape, world, options, 2).phases.values():
                for st in (s for s in stages if isinstance(s, RingStage)):
                    seen: dict[tuple, tuple] = {}
                    for r in range(len(st.rings)):
                        for pos in range(st.size):
                            for src in range(st.size):
                                cost = job.ring_work(*st.blocks(r, pos, src), st.heads, st.factor)
                                want = seen.setdefault(_kind(st, r, pos, src), cost)
                                assert cost == want, (name, options, st.label, r, pos, src)
                                checked += 1
    assert checked > 1000


@pytest.mark.parametrize(("n", "w"), [(1, 1), (8, 8), (8, 2), (12, 3), (16, 1)])
def test_sources_are_the_double_rings(n, w):
    src = sources(n, w)
    for step in range(n):
        o, i = divmod(step, w)
        assert src[step].tolist() == [NestedRing(n, w, p).source(o, i) for p in range(n)]
