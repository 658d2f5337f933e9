"""The `moe-placement` study: its cpu preset trains a tiny mixture of experts on 4 ranks (DP 2 x
SP 2) with EP 1/2/4 under ring and Ulysses, the EP groups within one (virtual) node or across two;
every point a valid trial the planner prices with its EP (what `seqpar plan --validate` holds it
to); its gpu-cluster preset Qwen3-30B-A3B at 128K on 16 GPUs with EP 1/8/16."""

from __future__ import annotations

import pytest

from seqpar import planner
from seqpar.experiments.registry import MEMORY_CLUSTER, STUDIES
from seqpar.planner import clusters, plan
from seqpar.rules.groups import ep_groups, ep_within_nodes

STUDY = STUDIES["moe-placement"]


def test_the_cpu_preset_crosses_ep_algorithms_and_placements():
    specs = [p.spec for p in STUDY.points("cpu")]
    assert len(specs) == 12 and all(s is not None for s in specs)
    seen = set()
    for s in specs:
        case = s.to_case()
        assert case.world == 4 and case.dp == 2 and case.sp == 2
        assert case.config().experts == 8 and case.model == "tiny-qwen3-moe"
        per_node = 4 // s.plan.nodes
        crossing = not ep_within_nodes(s.plan.ep, per_node)
        # EP 4 on two nodes of two is the one EP group that crosses them
        assert crossing == (s.plan.ep == 4 and s.plan.nodes == 2)
        assert ep_groups(4, s.plan.ep)[0] == list(range(s.plan.ep))
        seen.add((s.plan.ep, s.plan.algorithm, s.plan.nodes))
    assert seen == {(e, a, n) for e in (1, 2, 4) for a in ("ring", "ulysses") for n in (1, 2)}


@pytest.mark.parametrize("preset", ("cpu", "gpu-cluster"))
def test_every_point_is_priced_with_its_ep(preset):
    cluster = clusters.load(MEMORY_CLUSTER[preset])
    points = STUDY.points(preset)
    kept = [p for p in points if p.spec is not None]
    assert kept and all("exceeds" in str(p.error) for p in points if p.spec is None)
    for p in kept:
        predicted = planner.predict_trial(p.spec, cluster)
        assert predicted.policy.ep == p.spec.plan.ep
        assert predicted.step_ms > 0 and predicted.peak_mem_bytes <= cluster.memory_gb * 1e9
        assert (predicted.parts["ep_comm"] > 0) == (p.spec.plan.ep > 1)


def test_a_trial_s_states_traffic_is_priced_on_the_host_s_own_links():
    """The runner emulates its algorithms' and EP's transfers, not the gradients' reductions nor
    FSDP2's: under emulated links (the study's twin) those run on this host's own."""
    local = clusters.load("local")
    spec = next(p.spec for p in STUDY.points("cpu")
                if p.spec.plan.ep == 1 and p.spec.plan.nodes == 2)
    twin = plan.emulated(spec, local)
    assert twin.inter.bandwidth_gb_per_s < local.inter.bandwidth_gb_per_s
    all_twin = planner.predict_trial(spec, twin)
    host = planner.predict_trial(spec, twin, local)
    assert host.parts["exposed_comm"] < all_twin.parts["exposed_comm"]
    assert host.attention_ms == all_twin.attention_ms  # the attention's own: still the twin's
