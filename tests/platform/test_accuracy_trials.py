"""Accuracy trials (workload.mode accuracy): errors of out, dq, dk, dv against float64 on the same
rounded inputs, on one process, on a local gang, and as a study on Ray logged to MLflow."""

from __future__ import annotations

import dataclasses

import pytest

from seqpar.case import Case, Trial
from seqpar.workers.measure import accuracy, gang_measure, measure
from seqpar.workers.measure.reference import reference
from seqpar.workers.metrics import TrialMetrics

DOCS = (0, 5, 30, 31, 64)  # four documents of unequal lengths, one of a single token


def case(**kw) -> Case:
    base = dict(algorithm="local", world=1, layout="zigzag", causal=True, batch=1, seq_len=64,
                heads=4, kv_heads=2, head_dim=8, dtype="float64", mode="accuracy", warmup=0,
                iters=1, cu_seqlens=DOCS, window=9)
    return Case(**{**base, **kw})


def test_one_process_errors_are_rounding_of_the_dtype_and_catch_a_wrong_result(seed):
    exact = measure(case(seed=seed), 0, None).extra["errors"]
    assert set(exact) == {"out", "dq", "dk", "dv"} and max(exact.values()) < 1e-13
    bf16 = measure(case(seed=seed, dtype="bfloat16"), 0, None).extra["errors"]
    assert 1e-4 < max(bf16.values()) < 3e-2
    # the reference on the same rounded inputs: bf16 rounding of the inputs is not an error
    c = case(seed=seed, dtype="bfloat16")
    ref = reference(c, accuracy.rounded_inputs(c))
    assert max(accuracy.shard_errors(c, 0, ref, ref).values()) == 0.0
    wrong = {**ref, "dk": ref["dk"] * 1.01}
    assert accuracy.shard_errors(c, 0, wrong, ref)["dk"] == pytest.approx(0.01, rel=1e-6)


def test_trial_metrics_take_the_worst_rank():
    m = measure(case(), 0, None)
    worse = dataclasses.replace(m, rank=1, extra={"errors": {**m.extra["errors"], "dv": 0.5}})
    metrics = TrialMetrics.of(Trial(case(algorithm="ring", world=2), "g"), [m, worse])
    assert metrics["err_dv"] == 0.5 and metrics["err_max"] == 0.5
    assert metrics["err_out"] == m.extra["errors"]["out"]


@pytest.mark.parametrize(("algorithm", "options"), [("ring", ()), ("ulysses", ())])
def test_sharded_accuracy_trial_is_exact_in_float64_with_documents_and_window(gang, algorithm,
                                                                               options, seed):
    c = case(algorithm=algorithm, world=2, options=options, seed=seed)
    per_rank = gang.run(gang_measure, c, size=2)
    errors = [r.extra["errors"] for r in per_rank]
    assert max(max(e.values()) for e in errors) < 1e-12, errors


@pytest.mark.ray
@pytest.mark.slow
def test_accuracy_study_runs_on_ray_and_logs_errors_and_its_plot(ray_runner, tmp_path):
    from seqpar.platform.tracking import Tracker
    from seqpar.sweeps import spec
    from seqpar.sweeps.runner import run_sweep

    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db")
    plan = spec.parse({"study": "accuracy", "base": {
        "model": {"heads": 4, "kv_heads": 2, "head_dim": 8}, "workload": {"seq_len": 48}},
        "grid": {"plan": [{"algorithm": "ring", "world": 2}],  # one gang: start-up is the cost
                 "workload.dtype": ["float32", "bfloat16"]}})
    outcome = run_sweep(plan, tracker=tracker, runner=ray_runner, progress=False)
    runs = tracker.trials(outcome.sweep_id)
    assert len(runs) == 2 and {r.status for r in runs} == {"FINISHED"}
    for r in runs:
        tol = 1e-5 if r.params["workload.dtype"] == "float32" else 3e-2
        assert 0 < r.metrics["err_max"] < tol, (r.name, r.metrics["err_max"])
        assert r.metrics["err_max"] == max(r.metrics[f"err_{n}"] for n in ("out", "dq", "dk", "dv"))
    parent = tracker.sweep(outcome.sweep_id)
    assert parent.tags["seqpar.headline"] == "err_max" and "best.err_max" in parent.metrics
    assert tracker.artifacts(outcome.sweep_id, "plots") == ["plots/accuracy_vs_world.png"]
