"""`seqpar calibrate`'s waits (`sweeps.calibrate.host.step_waits`) on two local ranks of their own:
three non-negative numbers (a message's, a collective's, a queued collective's) as `Cluster.waits_us`
holds them, which the planner then charges. Their sizes are this machine's and vary run to run;
what is checked is the path and the physics that does not: a gradient's all-reduce costs more
than its dispatch."""

from __future__ import annotations

import pytest

from seqpar.planner import clusters, host
from seqpar.sweeps.calibrate.host import step_waits


@pytest.mark.multirank
def test_step_waits_gives_the_three_waits_the_planner_charges():
    local = clusters.load("local")
    got = step_waits(local, repeats=1, world=2)
    assert len(got) == 3 and all(x >= 0 for x in got), got
    assert got[2] > 0  # 21 all-reduces posted back to back take longer than their dispatch
    found = local.model_copy(update={"waits_us": {2: tuple(round(x * 1e6, 1) for x in got)}})
    saved = clusters.Cluster.model_validate_json(found.model_dump_json())
    assert host.waits(saved, 2) == pytest.approx(got, abs=1e-7)
