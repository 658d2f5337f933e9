"""Training trials on the platform: the spec's `train` section, the four studies' points, and one
DP x SP trial through the Ray rank workers with its metrics."""

from __future__ import annotations

import dataclasses

import pytest

from seqpar.case import TrainCase, Trial
from seqpar.errors import ConfigError
from seqpar.experiments.registry import STUDIES
from seqpar.experiments.spec import ExperimentSpec
from tests.resources import RAY_GANG  # the gang the Ray tests' trials share

TINY_SHAPE = {"heads": 4, "kv_heads": 2, "head_dim": 16}


def spec(**train):
    return {"model": TINY_SHAPE, "plan": {"algorithm": "ring", "world": 4},
            "workload": {"seq_len": 256}, "train": train}


def test_train_section_becomes_a_train_case():
    case = ExperimentSpec.parse(spec(checkpoint="sc++", dp=2, vocab=512)).to_case()
    assert isinstance(case, TrainCase)
    assert (case.sp, case.dp, case.world, case.config().vocab) == (2, 2, 4, 512)


@pytest.mark.parametrize(("train", "model", "field"), [
    ({"dp": 3}, TINY_SHAPE, "train.dp"),
    ({"checkpoint": "some"}, TINY_SHAPE, "train.checkpoint"),
    ({"model": "llama9"}, TINY_SHAPE, "train.model"),
    ({}, {"heads": 8, "kv_heads": 8, "head_dim": 32}, "model.shape"),
])
def test_bad_train_sections_name_their_field(train, model, field):
    data = spec(**train)
    data["model"] = model
    with pytest.raises(ConfigError, match=field):
        ExperimentSpec.parse(data)


@pytest.mark.parametrize("preset", ("cpu", "gpu-cluster"))
@pytest.mark.parametrize("name", ("e2e-throughput", "checkpointing", "lm-head", "e2e-scaling",
                                  "text"))
def test_training_studies_have_only_valid_points(name, preset):
    """Every point is a valid training trial that fits its device by the planner's arithmetic, or
    is skipped with that arithmetic; on GPUs with the states and precision a real run uses."""
    from seqpar import planner
    from seqpar.experiments.registry import MEMORY_CLUSTER
    from seqpar.planner import clusters

    points = STUDIES[name].points(preset)
    kept = [p for p in points if p.spec is not None]
    assert kept, [str(p.error) for p in points]
    for p in points:
        assert p.spec is not None or "exceeds" in str(p.error), str(p.error)
    cluster = clusters.load(MEMORY_CLUSTER[preset])
    for p in kept:
        case = p.spec.to_case()
        assert isinstance(case, TrainCase)
        assert planner.predict_trial(p.spec, cluster).peak_mem_bytes <= cluster.memory_gb * 1e9
        if preset == "gpu-cluster":
            assert (case.states, case.master_dtype, case.dtype) == ("fsdp", "float32", "bfloat16")


@pytest.mark.ray
def test_dp2_training_trial_runs_on_ray(ray_runner):
    case = TrainCase(algorithm="ring", sp=1, dp=2, layout="zigzag", seq_len=64, checkpoint="sc++",
                     fused_head=True, iters=2)
    result = ray_runner.run(Trial(case, RAY_GANG, timeout_s=300))
    assert result.status == "FINISHED", result.cause
    m = result.metrics
    for key in ("tgs", "tokens_per_s", "model_flops_per_s",
                "activation_bytes", "recomputed_flops", "peak_mem_bytes"):
        assert m[key] > 0, key
    assert m["tokens_per_s"] == pytest.approx(2 * 64 / (m["step_ms"] / 1e3))
    assert m["step_ms_ci_low"] <= m["step_ms"] <= m["step_ms_ci_high"]  # training's interval
    assert all(r.noise["wall_s"] > 0 for r in result.per_rank) and "noise_others_cpu_frac" in m
    losses = [r.extra["losses"] for r in result.per_rank]
    assert losses[0] == losses[1]  # the loss is averaged over the two replicas' batches


@pytest.mark.parametrize("preset", ("cpu", "gpu-cluster"))
def test_sp_policies_study_points_are_valid_steps_of_lengths(preset):
    """Every point of sp-policies is a training trial with dealt batches, under each policy."""
    points = STUDIES["sp-policies"].points(preset)
    assert all(p.spec is not None for p in points), [str(p.error) for p in points]
    cases = [p.spec.to_case() for p in points]
    assert {c.sp_policy for c in cases} == {"static", "dynamic"}
    assert {c.packing for c in cases if c.sp_policy == "static"} == {"best-fit", "cost-balanced"}
    for c in cases:
        assert c.lengths and len(c.batches) == 2 and c.world == c.batches[0].deal.pool


@pytest.mark.ray
def test_dynamic_training_trial_runs_on_ray(ray_runner):
    """A step of variable-length sequences under the dynamic policy through the Ray rank workers:
    the step's tokens, the policy's own numbers, the deal's group sizes."""
    from seqpar.experiments.steps import make_case

    case = dataclasses.replace(
        make_case("ring", 2, "lognormal:mean=40,sigma=1.0,min=8,max=128", tokens=512,
                  capacity=64, policy="dynamic", dtype="float32", batches=2),
        warmup=1, iters=2)
    result = ray_runner.run(Trial(case, RAY_GANG, timeout_s=300))
    assert result.status == "FINISHED", result.cause
    m = result.metrics
    assert m["tokens_per_s"] == pytest.approx(512 / (m["step_ms"] / 1e3))
    assert m["tgs"] == pytest.approx(m["tokens_per_s"] / 2)
    assert m["busy_imbalance"] >= 1.0 and m["deal_gap"] >= 1.0 and m["idle_ms_max"] >= 0
    sizes = {int(k.rsplit("_", 1)[1]) for k in m if k.startswith("seqs_on_group_")}
    assert sizes == {d for b in case.batches for d in b.deal.degrees}
    assert m.get("bytes_group_2", 0) > 0  # the pair's ring sent what the ledger booked
    assert m["batch_spread"] >= 1.0
