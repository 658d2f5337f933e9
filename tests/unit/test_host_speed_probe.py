"""The host's speed probe (`workers.measure.probe`): a CPU trial times it on each rank before and
after its timed loop (`noise_probe_ms`), `seqpar calibrate` beside its rates (`Cluster.probe_ms`),
and `seqpar plan --validate` holds each prediction at the speed the host ran the trial."""

from __future__ import annotations

import pytest
import torch

from seqpar.experiments.registry import STUDIES
from seqpar.planner import clusters
from seqpar.planner import plan as perf_plan
from seqpar.workers import stability
from seqpar.workers.measure import probe as probe_mod
from seqpar.workers.measure.timing import iterate


def test_the_probe_is_the_least_of_its_runs_on_this_threads_clock(monkeypatch):
    ticks = iter([0.0, 0.009, 1.0, 1.004, 2.0, 2.006])  # three runs: 9, 4 and 6 ms of CPU
    monkeypatch.setattr(probe_mod.time, "thread_time", lambda: next(ticks))
    assert probe_mod.probe_seconds() == pytest.approx(0.004)
    monkeypatch.undo()
    real = probe_mod.probe_seconds()
    assert 1e-4 < real < 1.0


def test_a_cpu_loop_probes_the_host_before_and_after_its_timed_passes(monkeypatch):
    readings = iter([0.004, 0.006])
    monkeypatch.setattr("seqpar.workers.measure.timing.probe_seconds", lambda: next(readings))
    loop = iterate(lambda: (0.001, 0.002, None), warmup=1, iters=2, device=torch.device("cpu"))
    assert loop.noise["probe_s"] == pytest.approx(0.005)  # their mean
    assert next(readings, None) is None  # twice: before and after


def test_host_noise_gives_the_ranks_mean_probe_and_leaves_it_out_when_none_probed():
    base = {"wall_s": 1.0, "cpu_s": 0.9, "cores": 2, "load_1m_before": 0.5,
            "load_1m_after": 0.5, "host": "h"}
    got = stability.host_noise([{**base, "probe_s": 0.004}, {**base, "probe_s": 0.006}])
    assert got["noise_probe_ms"] == pytest.approx(5.0)
    assert "noise_probe_ms" not in stability.host_noise([base, base])  # a GPU trial's ranks


def test_validate_reads_the_hosts_speed_beside_each_trial():
    """A trial whose probe read twice the calibration's: its `speed` is 2, a reading beside the
    error (not applied to it); without a probe, or a calibration's, 1."""
    spec = next(p.spec for p in STUDIES["attention-kinds"].points("cpu") if p.spec is not None)
    local = clusters.load("local").model_copy(update={"probe_ms": 4.0})
    slow, plain = perf_plan.validate([(spec, {"step_ms": 100.0, "noise_probe_ms": 8.0}),
                                      (spec, {"step_ms": 100.0})], local)
    assert slow.speed == pytest.approx(2.0) and plain.speed == 1.0
    assert slow.error == plain.error
    uncalibrated = clusters.load("local").model_copy(update={"probe_ms": None})
    (check,) = perf_plan.validate([(spec, {"step_ms": 1.0, "noise_probe_ms": 8.0})], uncalibrated)
    assert check.speed == 1.0


def test_validate_says_where_the_probe_would_make_the_median_trial_exact():
    """Each probed trial is exact where the probe reads its reading x predicted / measured (a
    step as slow as the probe); the summary takes their median, and leaves it out unprobed."""
    spec = next(p.spec for p in STUDIES["attention-kinds"].points("cpu") if p.spec is not None)
    local = clusters.load("local")
    (one,) = perf_plan.validate([(spec, {"step_ms": 100.0})], local)
    runs = [(spec, {"step_ms": one.predicted_ms * f, "noise_probe_ms": probe})
            for f, probe in ((1.0, 2.0), (1.25, 2.5), (0.8, 1.0))]
    checks = perf_plan.validate(runs, local)
    assert [c.probe_ms for c in checks] == [2.0, 2.5, 1.0]
    assert perf_plan.summary(checks)["probe_at_zero_error_ms"] == pytest.approx(2.0)
    assert "probe_at_zero_error_ms" not in perf_plan.summary([one])


def test_validate_prints_the_probes_range_and_where_the_median_trial_is_exact(monkeypatch, capsys):
    from types import SimpleNamespace

    from seqpar.cli import plan_validate

    point = next(p for p in STUDIES["attention-kinds"].points("cpu") if p.spec is not None)
    params = {k: str(v) for k, v in point.spec.flat().items()}  # as MLflow stores them
    local = clusters.load("local")
    (one,) = perf_plan.validate([(point.spec, {"step_ms": 1.0})], local)
    runs = [SimpleNamespace(params=params, metrics={"step_ms": one.predicted_ms * f,
                                                    "noise_probe_ms": probe})
            for f, probe in ((1.0, 2.0), (1.25, 2.5), (0.8, 1.0))]
    monkeypatch.setattr(plan_validate, "_reader", lambda sweep: SimpleNamespace(
        trials=lambda sweep_id: runs))
    plan_validate.validate("0123abcd", local, as_json=False)
    out = " ".join(capsys.readouterr().out.split())
    assert ("probe read 1.00-2.50 ms over the trials; the median trial is exact where it reads "
            "2.00 ms") in out
