"""Issue 9 item 12: every preset point fits the memory the performance model predicts, or is
skipped with that reason; emulated twins scale a cluster's links to this machine."""

from __future__ import annotations

import pytest

from seqpar.experiments import clusters, perf
from seqpar.experiments.registry import MEMORY_CLUSTER, STUDIES


def test_gpu_throughput_preset_skips_local_at_1m_tokens_by_arithmetic():
    points = STUDIES["throughput"].points("gpu-cluster")
    skipped = [p for p in points if p.spec is None and p.error.field == "memory"]
    assert any("local" in p.error.value and "1048576" in p.error.value for p in skipped)
    assert all("exceeds the 80 GB" in p.error.rule for p in skipped)


@pytest.mark.parametrize("preset", ["gpu-cluster"])
@pytest.mark.parametrize("study", sorted(STUDIES))
def test_every_preset_point_fits(study, preset):
    c = clusters.load(MEMORY_CLUSTER[preset])
    for p in STUDIES[study].points(preset):
        if p.spec is not None:
            assert perf.predict_spec(p.spec, c).peak_mem_bytes <= c.memory_gb * 1e9


def test_twin_keeps_the_clusters_compute_to_link_balance():
    a100, local = clusters.load("loongtrain-a100"), clusters.load("local")
    tw = clusters.twin(a100, local)
    ratio = local.rate("float32") / a100.rate("bfloat16")
    assert tw.intra.bandwidth_gb_per_s == pytest.approx(a100.intra.bandwidth_gb_per_s * ratio)
    assert tw.intra.latency_us == pytest.approx(a100.intra.latency_us / ratio)
    assert tw.inter.bandwidth_gb_per_s < tw.intra.bandwidth_gb_per_s


def test_throughput_placement_ring_size_wallfacer_studies_use_the_twin():
    from seqpar.experiments.spec import ClusterTwin

    for name in ("throughput", "placement", "ring-size", "wallfacer-c"):
        for p in STUDIES[name].points("cpu"):
            if p.spec is not None:
                assert isinstance(p.spec.env.link_emulation, ClusterTwin)
                links = p.spec.env.link_models()
                assert links["inter"].bandwidth_bytes_per_s < links["intra"].bandwidth_bytes_per_s


def test_local_cluster_ships_measured():
    local = clusters.load("local")
    assert local.cores and local.attention_tflops["float32"] > 0
    assert "seqpar calibrate" in local.source


def test_validation_predicts_on_the_trials_emulated_links():
    from seqpar.experiments.perf.plan import emulated
    from seqpar.experiments.spec import ExperimentSpec

    spec = ExperimentSpec.parse({
        "model": "tiny", "plan": {"algorithm": "ring", "world": 4, "nodes": 2},
        "workload": {"seq_len": 1024},
        "env": {"link_emulation": {"inter": {"latency_us": 50.0, "bandwidth_gb_per_s": 1.0},
                                   "intra": {"latency_us": 5.0, "bandwidth_gb_per_s": 10.0}}}})
    local = clusters.load("local")
    c = emulated(spec, local)
    assert (c.inter.latency_us, c.inter.bandwidth_gb_per_s) == (50.0, 1.0)
    assert not c.shared_links and c.attention_tflops == local.attention_tflops
    slow = perf.predict_spec(spec, c)
    assert slow.attention_ms > perf.predict_spec(spec, local).attention_ms
