"""`seqpar calibrate`'s waits (`sweeps.calibrate.host.step_waits`) on two local ranks of their own:
three non-negative numbers (a message's, a collective's, a queued collective's) as `Cluster.waits_us`
holds them, the transport threads' CPU a message and a collective (`transport_cpu_us`) and the
spread of equal work side by side (`spread`), which the planner then charges. Their sizes are this
machine's and vary run to run; what is checked is the path and the physics that does not: a
gradient's all-reduce costs more than its dispatch, gloo's threads spend CPU on a collective, and
the last of two ranks finishes equal work after their mean."""

from __future__ import annotations

import pytest

from seqpar.planner import clusters, host
from seqpar.sweeps.calibrate.host import step_waits


@pytest.mark.multirank
def test_step_waits_gives_the_three_waits_the_planner_charges():
    local = clusters.load("local")
    got, cpu, spread = step_waits(local, repeats=1, world=2)
    assert len(got) == 3 and all(x >= 0 for x in got), got
    assert got[2] > 0  # 21 all-reduces posted back to back take longer than their dispatch
    assert len(cpu) == 2 and cpu[1] > 0 and cpu[0] >= 0, cpu
    assert spread > 0  # E[max] of two noisy finishing times exceeds their mean
    found = local.model_copy(update={"waits_us": {2: tuple(round(x * 1e6, 1) for x in got)},
                                     "transport_cpu_us": {2: tuple(round(x * 1e6, 1) for x in cpu)},
                                     "spread": {2: spread}})
    saved = clusters.Cluster.model_validate_json(found.model_dump_json())
    assert host.waits(saved, 2) == pytest.approx(got, abs=1e-7)
    assert saved.spread == {2: spread} and saved.transport_cpu_us[2][1] > 0
