"""Every valid configuration ranked by predicted time (what `seqpar plan` prints: `scopes`,
imported here too), and predictions held against a finished sweep's measurements
(`seqpar plan --validate`)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from seqpar.planner.clusters import Cluster, Link
from seqpar.planner.lengths_time import predict_case
from seqpar.planner.scopes import (  # noqa: F401  (the ranking's names, as before)
    Space,
    equivalents,
    model_params_of,
    model_search,
    model_shape,
    rank,
)
from seqpar.planner.trial import predict_trial
from seqpar.rules import algorithms
from seqpar.rules.pool import AUTO


# ------------------------------------------------------------------------------- validation
@dataclass
class Check:
    label: str
    measured_ms: float
    predicted_ms: float
    group: str = ""  # trials that answer one question (same workload and shape): best is chosen here
    # a training trial's memory, {"state_bytes" | "activation_bytes": (predicted, measured)}
    memory: dict[str, tuple[float, float]] = field(default_factory=dict)
    # a trial of lengths: max / mean attention FLOPs over ranks, (predicted, measured
    # load_imbalance)
    imbalance: tuple[float, float] | None = None
    others: float = 0.0  # the host's CPU that other processes took over the timed loop (a share)
    # the trial's speed probe over the calibration's (`workers.measure.probe`; 1: not probed): a
    # reading of the host, shown beside the error, not applied to it (ranks side by side slow the
    # probe as they slow each other, which the calibration's waits already hold)
    speed: float = 1.0
    probe_ms: float | None = None  # the trial's own probe reading (`noise_probe_ms`; None: none)

    @property
    def error(self) -> float:
        return (self.predicted_ms - self.measured_ms) / self.measured_ms

    @property
    def shared_error(self) -> float:
        """The error with the ranks' fair share of a host whose other processes took `others` of
        it: the prediction over (1 - others)."""
        return (self.predicted_ms / max(1e-9, 1 - self.others) - self.measured_ms) / self.measured_ms


def emulated(spec: Any, cluster: Cluster) -> Cluster:
    """The cluster a trial ran on: `cluster` (this machine), with the trial's emulated links when
    it had any (each rank's transfers delayed on their own: one NIC per rank)."""
    links = spec.env.emulated_links(spec.workload.dtype)
    if not links:
        return cluster
    return cluster.model_copy(update={
        k: Link(bandwidth_gb_per_s=v.bandwidth_gb_per_s, latency_us=v.latency_us)
        for k, v in links.items()} | {"nics_per_node": cluster.gpus_per_node, "shared_links": False})


def validate(trials: Iterable[tuple[Any, Mapping[str, float]]], cluster: Cluster) -> list[Check]:
    """(ExperimentSpec, metrics) of finished trials -> predicted vs measured step time (the specs
    rebuilt from MLflow's params by `experiments.spec.specs_of`)."""
    out = []
    for spec, metrics in trials:
        if "step_ms" not in metrics:
            continue
        if spec.plan.algorithm not in algorithms.REGISTRY and spec.plan.algorithm != AUTO:
            continue
        w, m = spec.workload, spec.model
        if w.lengths is not None:
            out.append(_lengths_check(spec, emulated(spec, cluster), metrics))
            continue
        p = predict_trial(spec, emulated(spec, cluster), cluster)
        group = f"N={w.seq_len} B={w.batch} H={m.heads}/{m.hkv} D={m.head_dim} {w.dtype} {w.mode}"
        memory = {}
        if spec.train is not None:
            group = f"train {spec.train.model} " + group
            memory = {f"{k}_bytes": (float(p.memory[part]), float(metrics[f"{k}_bytes"]))
                      for k, part in _MEMORY_PART.items() if f"{k}_bytes" in metrics}
        predicted = p.step_ms if spec.train is not None else p.attention_ms
        probe = metrics.get("noise_probe_ms")
        out.append(Check(spec.label(), float(metrics["step_ms"]), predicted, group, memory,
                         others=float(metrics.get("noise_others_cpu_frac", 0.0)),
                         speed=float(probe) / cluster.probe_ms if probe and cluster.probe_ms
                         else 1.0, probe_ms=float(probe) if probe else None))
    return out


_MEMORY_PART = {"state": "states", "activation": "activations"}


def _lengths_check(spec: Any, cluster: Cluster, metrics: Mapping[str, float]) -> Check:
    """A trial of lengths: its step as dealt and run (`lengths_time.predict_case`), and the
    predicted FLOPs imbalance beside the measured `load_imbalance`."""
    s = predict_case(spec.to_case(), cluster, max(1, spec.plan.nodes))
    w = spec.workload
    group = f"train {spec.train.model} {w.lengths} T={w.tokens_per_step} P={spec.plan.world} {w.dtype}"
    measured = metrics.get("load_imbalance")
    return Check(spec.label(), float(metrics["step_ms"]), s.step_ms, group,
                 imbalance=None if measured is None else (s.imbalance, float(measured)))


def summary(checks: Sequence[Check]) -> dict[str, Any]:
    """Median absolute error over the trials; per group of comparable trials (same workload and
    shape), the measured time of the predicted best over the measured best (the regret)."""
    if not checks:
        return {"trials": 0}
    groups: dict[str, list[Check]] = {}
    for c in checks:
        groups.setdefault(c.group, []).append(c)
    regrets = {}
    for name, members in groups.items():
        pick = min(members, key=lambda c: c.predicted_ms)
        regrets[name] = (pick.label, pick.measured_ms / min(c.measured_ms for c in members) - 1)
    paired = [c.imbalance for c in checks if c.imbalance is not None]
    probed = [c.predicted_ms / c.measured_ms * c.probe_ms for c in checks if c.probe_ms]
    return {"trials": len(checks),
            "median_abs_error": statistics.median(abs(c.error) for c in checks),
            "median_abs_error_host_share": statistics.median(abs(c.shared_error) for c in checks),
            **({"imbalance_median_abs_error": statistics.median(
                abs(p - m) / m for p, m in paired)} if paired else {}),
            # the probe reading at which the median trial would be exact, were its step as slow
            # as the probe (`docs/planner.md`: what the host's speed leaves of the error)
            **({"probe_at_zero_error_ms": statistics.median(probed)} if probed else {}),
            "regret": {g: r for g, (_, r) in regrets.items()},
            "predicted_best": {g: label for g, (label, _) in regrets.items()},
            "max_regret": max(r for _, r in regrets.values())}
