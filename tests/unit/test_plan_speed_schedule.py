"""The planner's schedules, built faster, hold what the rules say: a WallFacer grid's sub-rings
(`schedule._teams`, every position at once) are `WallFacerGrid.subring`'s, rank for rank."""

from __future__ import annotations

import numpy as np

from seqpar.planner import schedule
from seqpar.rules.groups import WALLFACER_PLACEMENTS, WallFacerGrid


def test_a_wallfacer_schedules_sub_rings_are_the_grids():
    checked = 0
    for world in (1, 4, 8, 16, 48, 64, 72, 256, 1024):
        for c in (1, 2, 3, 4, 8, 16, 32):
            if c * c > world or world % (c * c):
                continue
            for placement in WALLFACER_PLACEMENTS:
                grid = WallFacerGrid(world, c, placement)
                t = grid.ring_size
                starts = grid.rank(np.array([g * t * c + a for g in range(c) for a in range(c)]))
                want = np.stack(grid.subring(starts), axis=1).tolist()
                assert schedule._teams(world, c, placement).rings == want, (world, c, placement)
                checked += 1
    assert checked > 40
