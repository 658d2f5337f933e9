"""`predict`: one configuration -> a Prediction (what `seqpar plan` ranks and prints)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from seqpar.planner import memory
from seqpar.planner.clusters import Cluster
from seqpar.planner.predict import Job, attention
from seqpar.planner.schedule import schedule
from seqpar.rules import masks
from seqpar.rules.shape import AttnShape


@dataclass
class Prediction:
    algorithm: str
    options: dict[str, Any]
    layout: str
    attention_ms: float                 # one attention layer, forward + backward
    forward_ms: float
    compute_ms: float
    exposed_ms: dict[str, float]        # exposed communication by link class
    bytes_intra: int
    bytes_inter: int
    peak_mem_bytes: int
    fits: bool
    bottleneck: str
    step_ms: float | None = None
    mfu: float | None = None
    stages: list[tuple[str, float]] = field(default_factory=list)
    memory: dict[str, int] = field(default_factory=dict)  # a training step's parts (model scope)
    forward_bytes: tuple[int, int] = (0, 0)  # the forward's (intra, inter) bytes
    # ms the call keeps each link class busy (its busiest link), forward + backward and forward
    # alone: what a training step's other traffic on those links shares with it (`step`)
    link_ms: dict[str, float] = field(default_factory=lambda: {"intra": 0.0, "inter": 0.0})
    forward_link_ms: dict[str, float] = field(default_factory=lambda: {"intra": 0.0,
                                                                       "inter": 0.0})

    def json(self) -> dict[str, Any]:
        return {"algorithm": self.algorithm, "options": self.options, "layout": self.layout,
                "predicted": {"attention_ms": round(self.attention_ms, 4),
                              "step_ms": None if self.step_ms is None else round(self.step_ms, 4),
                              "bytes_intra": self.bytes_intra, "bytes_inter": self.bytes_inter,
                              "peak_mem_bytes": self.peak_mem_bytes,
                              "mfu": None if self.mfu is None else round(self.mfu, 4),
                              **({"memory": self.memory} if self.memory else {})},
                "fits": self.fits, "bottleneck": self.bottleneck}


def predict(cluster: Cluster, name: str, shape: AttnShape, world: int, *, nodes: int = 1,
            options: Mapping[str, Any] | None = None, layout: str = "zigzag", causal: bool = True,
            dtype: str = "bfloat16", mode: str = "fwd+bwd",
            mask: masks.Mask | None = None) -> Prediction:
    """Attention scope: one layer's forward (+ backward) on `cluster` with P = world ranks, under
    a plain causal (or full) relation, or any `mask` of shape.seq_len tokens."""
    options = dict(options or {})
    if mask is not None:
        causal = mask.plain and mask.relation.causal if mask.plain else mask.causal
    job = Job(cluster, shape, world, nodes, layout, causal, dtype, mask)
    fwd, bwd = attention(job, name, options)
    both = mode == "fwd+bwd"
    seconds = fwd.seconds + (bwd.seconds if both else 0.0)
    exposed = {k: 1e3 * (fwd.exposed[k] + (bwd.exposed[k] if both else 0.0)) for k in fwd.exposed}
    peak = attention_peak(name, shape, world, options, nodes)
    worst = max(exposed, key=lambda k: exposed[k])
    bottleneck = (f"{worst}-node communication" if exposed[worst] > 0.1e3 * seconds else "compute")
    return Prediction(
        name, options, layout, 1e3 * seconds, 1e3 * fwd.seconds,
        1e3 * (fwd.compute_s + (bwd.compute_s if both else 0.0)), exposed,
        fwd.bytes_intra + (bwd.bytes_intra if both else 0),
        fwd.bytes_inter + (bwd.bytes_inter if both else 0), peak,
        peak <= cluster.memory_gb * 1e9, bottleneck,
        stages=[(f"fwd {label}", s) for label, s in fwd.stages]
        + ([(f"bwd {label}", s) for label, s in bwd.stages] if both else []),
        forward_bytes=(fwd.bytes_intra, fwd.bytes_inter),
        link_ms={k: 1e3 * (fwd.busy[k] + (bwd.busy[k] if both else 0.0)) for k in fwd.busy},
        forward_link_ms={k: 1e3 * v for k, v in fwd.busy.items()})


def attention_peak(name: str, shape: AttnShape, world: int, options: Mapping[str, Any],
                   nodes: int = 1) -> int:
    """Bytes one rank holds at the attention's peak (what `fits` compares to the device;
    memoised: a search asks before it times a configuration, and the prediction asks again)."""
    key = (name, shape, world, tuple(sorted(options.items())), nodes)
    got = _PEAKS.get(key)
    if got is None:
        if len(_PEAKS) > 8192:
            _PEAKS.clear()
        got = _PEAKS[key] = memory.attention_peak(name, shape, world, options,
                                                  schedule(name, shape, world, options, nodes))
    return got


_PEAKS: dict[tuple, int] = {}


def predict_spec(spec: Any, cluster: Cluster) -> Prediction:
    """A Prediction for an ExperimentSpec (the sweeps' and tune's unit)."""
    p, w = spec.plan, spec.workload
    return predict(cluster, p.algorithm, spec.shape, p.world, nodes=p.nodes,
                   options=dict(p.options), layout=p.layout, causal=w.causal, dtype=w.dtype,
                   mode=w.mode)
