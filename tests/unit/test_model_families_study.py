"""The `model-families` study: its cpu preset trains the families' tiny decoders (dense, QK-norm, a
window pattern, sinks, MoE; models/tiny-*.json, read as any config.json is) on real text at P = 2,
every point a valid trial the planner prices (what `seqpar plan --validate` holds it to); its
gpu-cluster preset the published models at 128K on 16 GPUs."""

from __future__ import annotations

import dataclasses

import pytest

from seqpar import planner
from seqpar.case import TrainCase, Trial
from seqpar.experiments.registry import MEMORY_CLUSTER, STUDIES
from seqpar.experiments.train_studies import CPU_FAMILIES
from seqpar.model import ModelConfig, Transformer
from seqpar.planner import clusters
from tests.resources import RAY_GANG  # the gang the Ray tests' trials share

STUDY = STUDIES["model-families"]


def test_the_cpu_preset_trains_each_kind_of_decoder_with_two_algorithms():
    specs = [p.spec for p in STUDY.points("cpu")]
    assert all(s is not None for s in specs)
    cases = [s.to_case() for s in specs]
    assert all(isinstance(c, TrainCase) and c.world == 2 and c.text for c in cases)
    assert {(c.model, c.algorithm) for c in cases} == {
        (m, a) for m in CPU_FAMILIES for a in ("ring", "ulysses")}
    cfgs = {c.model: c.config() for c in cases}
    dense = cfgs["tiny"]
    assert not any((dense.qk_norm, dense.sinks, dense.experts, dense.window))
    assert cfgs["tiny-qwen3"].qk_norm and cfgs["tiny-qwen3"].head_dim * 4 != 64
    assert cfgs["tiny-gemma3"].layer_types == ("sliding",) * 5 + ("full",)
    assert cfgs["tiny-gpt-oss"].sinks and cfgs["tiny-gpt-oss"].experts == 8
    assert cfgs["tiny-qwen3-moe"].active_params() < cfgs["tiny-qwen3-moe"].params()
    for cfg in cfgs.values():
        Transformer(cfg)  # the torch decoder computes every one of them


@pytest.mark.parametrize("preset", ("cpu", "gpu-cluster"))
def test_every_point_is_priced_by_the_planner_or_says_why_not(preset):
    cluster = clusters.load(MEMORY_CLUSTER[preset])
    points = STUDY.points(preset)
    kept = [p for p in points if p.spec is not None]
    assert kept
    for p in points:  # a published model not yet a preset names itself; else the memory rule
        assert p.spec is not None or "train.model" in str(p.error) or "exceeds" in str(p.error)
    for p in kept:
        predicted = planner.predict_trial(p.spec, cluster)
        assert predicted.step_ms > 0 and predicted.peak_mem_bytes <= cluster.memory_gb * 1e9


@pytest.mark.ray
@pytest.mark.slow  # a training trial on Ray: tests/model/test_train_platform.py; sinks exact: multirank
def test_the_sinks_decoder_trains_on_ray_and_its_loss_falls(ray_runner):
    """gpt-oss's tiny decoder (sinks, alternating windows, experts) on two Ray ranks, on the
    study's text: its metrics logged, the loss of the last step below the first's."""
    spec = next(p.spec for p in STUDY.points("cpu")
                if p.spec.to_case().model == "tiny-gpt-oss" and p.spec.plan.algorithm == "ring")
    case = spec.to_case()
    short = dataclasses.replace(case, seq_len=128, warmup=0, iters=8)
    result = ray_runner.run(Trial(short, RAY_GANG, timeout_s=300))
    assert result.status == "FINISHED", result.cause
    assert result.metrics["tgs"] > 0 and result.metrics["peak_mem_bytes"] > 0
    losses = result.per_rank[0].extra["losses"]
    assert losses[-1] < losses[0], losses
    assert ModelConfig.load(short.model).sinks
