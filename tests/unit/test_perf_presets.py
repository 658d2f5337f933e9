"""Issue 9 item 12: every preset point fits the memory the performance model predicts, or is
skipped with that reason; emulated twins scale a cluster's links to this machine."""

from __future__ import annotations

import re

import pytest

from seqpar import planner
from seqpar.experiments.grid import expand
from seqpar.experiments.registry import MEMORY_CLUSTER, STUDIES, fitting
from seqpar.planner import clusters


def test_gpu_throughput_preset_skips_local_at_1m_tokens_by_arithmetic():
    points = STUDIES["throughput"].points("gpu-cluster")
    skipped = [p for p in points if p.spec is None and p.error.field == "memory"]
    assert any("local" in p.error.value and "1048576" in p.error.value for p in skipped)
    assert all("exceeds the 80 GB" in p.error.rule for p in skipped)


@pytest.mark.parametrize("study", ["memory", "throughput"])
def test_a_smaller_device_keeps_only_the_points_that_fit_it_and_says_why(study, tmp_path):
    """The memory filter against a device chosen so that about half a preset's points fit: it
    keeps exactly those, fewer than on the real device, and every point it drops names a
    predicted peak above that device's memory (a filter that kept everything, dropped the wrong
    side or misreported the arithmetic fails here)."""
    a100 = clusters.load(MEMORY_CLUSTER["gpu-cluster"])
    raw = expand(*STUDIES[study].sweep("gpu-cluster"))
    peaks = {p.spec.hash: planner.predict_trial(p.spec, a100).peak_mem_bytes for p in raw if p.spec}
    gb = sorted(peaks.values())[len(peaks) // 2] / 1e9
    half = tmp_path / "half.yaml"
    half.write_text(a100.model_copy(update={"name": "half", "memory_gb": gb}).to_yaml())
    small = fitting(raw, str(half))
    kept = {p.spec.hash for p in small if p.spec is not None}
    assert kept == {h for h, peak in peaks.items() if peak <= gb * 1e9}
    assert 0 < len(kept) < len({p.spec.hash for p in fitting(raw, "loongtrain-a100") if p.spec})
    for p in small:
        if p.spec is None and p.error.field == "memory":
            predicted = float(re.search(r"predicted peak ([\d.]+) GB", p.error.rule).group(1))
            assert predicted > gb and f"{gb:g} GB" in p.error.rule


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
    from seqpar.experiments.spec import ExperimentSpec
    from seqpar.planner.plan import emulated

    spec = ExperimentSpec.parse({
        "model": "tiny", "plan": {"algorithm": "ring", "world": 4, "nodes": 2},
        "workload": {"seq_len": 1024},
        "env": {"link_emulation": {"inter": {"latency_us": 50.0, "bandwidth_gb_per_s": 1.0},
                                   "intra": {"latency_us": 5.0, "bandwidth_gb_per_s": 10.0}}}})
    local = clusters.load("local")
    c = emulated(spec, local)
    assert (c.inter.latency_us, c.inter.bandwidth_gb_per_s) == (50.0, 1.0)
    assert not c.shared_links and c.attention_tflops == local.attention_tflops
    slow = planner.predict_spec(spec, c)
    assert slow.attention_ms > planner.predict_spec(spec, local).attention_ms
