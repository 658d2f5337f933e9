"""Every valid configuration ranked by predicted time (what `seqpar plan` prints), and predictions
held against a finished sweep's measurements (`seqpar plan --validate`)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from seqpar.errors import ConfigError, require
from seqpar.planner.api import Prediction, predict
from seqpar.planner.clusters import Cluster, Link
from seqpar.planner.lengths_time import predict_case
from seqpar.planner.policy import Filters
from seqpar.planner.rates import DEFAULT_KERNEL, with_kernel
from seqpar.planner.search import Result, check_counts, make_setup, search
from seqpar.planner.setup import shape_of
from seqpar.planner.trial import predict_trial
from seqpar.rules import algorithms, masks
from seqpar.rules.counts import model_params
from seqpar.rules.layouts import LAYOUTS
from seqpar.rules.model import load, presets
from seqpar.rules.pool import AUTO
from seqpar.rules.shape import DTYPE_BYTES, SHAPE_PRESETS, AttnShape

Space = Iterable[tuple[str, Mapping[str, Any]]]


def model_shape(model: str, seq_len: int, dtype: str = "bfloat16") -> tuple[AttnShape, Any]:
    """(attention shape, ModelConfig or None) for a model: a ModelConfig preset, a YAML of its
    fields or a Hugging Face config.json (`seqpar.rules.model.load`), else an attention-shape
    preset (`rules.shape.SHAPE_PRESETS`, attention scope only)."""

    elem = DTYPE_BYTES[dtype]
    if model in SHAPE_PRESETS and model not in presets():
        s = SHAPE_PRESETS[model]
        return AttnShape(1, seq_len, s["heads"], s["kv_heads"], s["head_dim"], elem), None
    if model not in presets() and not model.endswith((".yaml", ".yml", ".json")):
        names = ", ".join(sorted({*presets(), *SHAPE_PRESETS}))
        require(False, "model", model, f"must be one of {names}, a YAML file of ModelConfig's "
                "fields or a Hugging Face config.json")
    cfg = load(model)
    return shape_of(cfg, seq_len, elem_bytes=elem), cfg


def model_params_of(model: str) -> dict[str, int] | None:
    """`--json`'s `model_params` of a model (`rules.counts.model_params`: {"total", "active"});
    None for an attention-shape preset, which names no decoder."""
    cfg = model_shape(model, 1)[1]
    return None if cfg is None else model_params(cfg)


def model_search(cluster: Cluster, model: str, seq_len: int, world: int, space: Space, *,
                 nodes: int = 1, layouts: Sequence[str] = LAYOUTS, causal: bool = True,
                 dtype: str = "bfloat16", kernel: str = DEFAULT_KERNEL,
                 filters: Filters | None = None, mask: str | None = None,
                 every: bool = False, routing_skew: float = 1.0) -> Result:
    """The model scope's search: the whole step (`step.Step`) of every configuration of one SP
    group of `world` ranks (DP = 1, one sequence a step) and policy, fitting ones first by TGS
    (`search.search`: dominated attention configurations pruned, or with `every` listed once
    each, marked)."""
    check_counts(seq_len=seq_len, world=world, nodes=nodes)
    cfg = model_shape(model, seq_len, dtype)[1]
    require(cfg is not None, "model", model, "--scope model needs a decoder (a ModelConfig "
            "preset, a YAML of its fields or a config.json), not an attention shape")
    f = replace(filters or Filters(), dp=1, sp=world)
    setup = make_setup(cluster, cfg, seq_len, seq_len, world, nodes, kernel=kernel, dtype=dtype,
                       causal=causal, mask=mask, ep=f.ep, routing_skew=routing_skew)
    return search(setup, f, attention=list(space), layouts=layouts, every=every)


def rank(cluster: Cluster, model: str, seq_len: int, world: int, space: Space, *, nodes: int = 1,
         scope: str = "attention", layouts: Sequence[str] = LAYOUTS, causal: bool = True,
         dtype: str = "bfloat16", kernel: str = DEFAULT_KERNEL,
         filters: Filters | None = None, mask: str | None = None) -> list[Any]:
    """Attention scope: a Prediction for every valid (algorithm, options, layout), fitting ones
    first by time. Model scope: `model_search`'s ranked steps. `mask`: any mask's spec
    (`masks.parse`) in place of plain causal attention."""
    require(scope in ("attention", "model"), "scope", scope, "must be attention or model")
    check_counts(seq_len=seq_len, world=world, nodes=nodes)
    shape, cfg = model_shape(model, seq_len, dtype)
    if scope == "model":
        return model_search(cluster, model, seq_len, world, space, nodes=nodes, layouts=layouts,
                            causal=causal, dtype=dtype, kernel=kernel, filters=filters,
                            mask=mask).ranked
    cluster = with_kernel(cluster, kernel, shape.head_dim, dtype)[0]
    m = None if mask is None else masks.parse(mask, seq_len)
    causal = causal if m is None else m.causal
    out: list[Prediction] = []
    for name, options in space:
        for layout in layouts:
            try:
                algorithms.check(name, shape, world, layout, causal, **options)
            except ConfigError:
                continue
            out.append(predict(cluster, name, shape, world, nodes=nodes, options=options,
                               layout=layout, causal=causal, dtype=dtype, mask=m))
    return sorted(out, key=lambda p: (not p.fits, p.attention_ms))


def _same(p: Prediction) -> tuple:
    """What two configurations must share to be one row: every predicted number (to 1e-9)."""
    def r(x: float | None) -> float | None:
        return None if x is None else float(f"{x:.9g}")

    return (p.algorithm, p.fits, p.bottleneck, r(p.attention_ms), r(p.forward_ms), r(p.compute_ms),
            r(p.exposed_ms["intra"]), r(p.exposed_ms["inter"]), p.bytes_intra, p.bytes_inter,
            p.peak_mem_bytes, r(p.step_ms), r(p.mfu))


def equivalents(ranked: Sequence[Prediction]) -> list[list[Prediction]]:
    """The ranked configurations in groups of one algorithm whose predictions are identical (a
    layout or an option that changes nothing at this shape: ulysses's layout, usp's inner ring
    when its context ring is one node), in rank order of each group's first member."""
    groups: dict[tuple, list[Prediction]] = {}
    for p in ranked:
        groups.setdefault(_same(p), []).append(p)
    return list(groups.values())


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
    # how much slower the host ran the trial than when calibrated: its speed probe over the
    # calibration's (`workers.measure.probe`; 1: not probed)
    speed: float = 1.0

    @property
    def error(self) -> float:
        return (self.predicted_ms - self.measured_ms) / self.measured_ms

    @property
    def shared_error(self) -> float:
        """The error with the ranks' fair share of a host whose other processes took `others` of
        it: the prediction over (1 - others)."""
        return (self.predicted_ms / max(1e-9, 1 - self.others) - self.measured_ms) / self.measured_ms

    @property
    def speed_error(self) -> float:
        """The error at the speed the host ran the trial: the prediction times `speed`."""
        return (self.predicted_ms * self.speed - self.measured_ms) / self.measured_ms


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
                         else 1.0))
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
    return {"trials": len(checks),
            "median_abs_error": statistics.median(abs(c.error) for c in checks),
            "median_abs_error_host_share": statistics.median(abs(c.shared_error) for c in checks),
            **({"median_abs_error_host_speed": statistics.median(
                abs(c.speed_error) for c in checks)} if any(c.speed != 1.0 for c in checks)
               else {}),
            **({"imbalance_median_abs_error": statistics.median(
                abs(p - m) / m for p, m in paired)} if paired else {}),
            "regret": {g: r for g, (_, r) in regrets.items()},
            "predicted_best": {g: label for g, (label, _) in regrets.items()},
            "max_regret": max(r for _, r in regrets.values())}
