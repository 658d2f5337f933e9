"""A trial's outcome on the whole gang, and the headline metrics aggregated over its ranks.

Conventions: a step is one iteration on every rank, so step time is the max over ranks of that
iteration (the slowest rank sets the pace), and its median over iterations is `step_ms`. Bytes are
one iteration's; `bytes_<phase>_<op>_<link>` is per rank (max over ranks), while `bytes_total`,
`bytes_intra` and `bytes_inter` are the whole gang's (sum over ranks), so intra + inter = total.
FLOPs are the ledger's: each kernel call counts the (query, key) pairs it computes, so blocks no
query sees (other documents, outside a window) count nothing. An accuracy trial adds `err_out`,
`err_dq`, `err_dk`, `err_dv` (relative to float64, max over ranks) and `err_max`.
`step_ms_ci_low` / `step_ms_ci_high` bound the median step at 95% and `noise_*` say how busy the
hosts were (`workers.stability`); `unstable` says why a trial's time cannot be trusted, if it can't.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

from seqpar.case import Case, TrainCase
from seqpar.platform.devices import peak_flops
from seqpar.workers import stability
from seqpar.workers.measure.record import RankMeasurement, percentile
from seqpar.workers.measure.train import train_metrics


def _per_step(per_rank: list[RankMeasurement], attr: str) -> list[float]:
    """Each iteration's time on the slowest rank."""
    series = [getattr(m, attr) for m in per_rank]
    return [max(values) for values in zip(*series, strict=True)]


def _bytes_by_key(m: RankMeasurement) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in m.ledger.get("entries", []):
        key = f"bytes_{e['phase']}_{e['op']}_{e['link']}"
        out[key] = out.get(key, 0) + e["bytes_sent"]
    return out


def link_bytes(m: RankMeasurement, link: str) -> int:
    """One iteration's bytes this rank sent over `link` ('intra' | 'inter')."""
    return sum(e["bytes_sent"] for e in m.ledger.get("entries", []) if e["link"] == link)


class FailureKind(str, Enum):
    """Why a trial FAILED, in the spirit of Ray Train's WorkerGroupError / ControllerError: a
    rank's own exception is deterministic (the same input raises again); the rest are the cluster's
    and a fresh gang may well succeed, so `--retries` re-runs only those."""

    RANK_RAISED = "rank_raised"  # the trial's code raised on a rank (ValueError, OOM, ...)
    RANK_DIED = "rank_died"      # a rank's process or node went away, or a collective broke
    TIMEOUT = "timeout"          # the trial outlived timeout_s (a hang, a lost peer)
    STARTUP = "startup"          # the gang or its process-group rendezvous did not come up

    @property
    def retryable(self) -> bool:
        return self is not FailureKind.RANK_RAISED


@dataclass
class TrialResult:
    case: Case | TrainCase
    status: str  # "FINISHED" | "FAILED"
    cause: str | None
    per_rank: list[RankMeasurement]
    node_of_rank: list[int]
    link_emulation: dict | None  # {"inter": {"latency_s": .., "bandwidth_bytes_per_s": ..}}
    setup_s: float  # gang (start or reuse) + rendezvous
    run_s: float    # the trial on every rank, process group included
    device: str
    experiment_id: str | None = None
    topology: str = "virtual"  # "virtual" nodes on one machine | "real" Ray nodes
    gang_reused: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    failure: FailureKind | None = None  # set exactly when status is FAILED

    @property
    def ok(self) -> bool:
        return self.status == "FINISHED"

    def metrics(self) -> dict[str, float]:
        """Headline numbers (see the module docstring); {} for a failed trial."""
        if not self.ok or not self.per_rank:
            return {}
        case, ranks = self.case, self.per_rank
        steps = _per_step(ranks, "step_ms")
        timing = stability.step_stats(steps)
        step_ms = timing["step_ms"]
        tokens_per_s = case.batch * case.seq_len / (step_ms / 1e3)
        rank_flops = [sum(m.flops.values()) for m in ranks]
        out: dict[str, float] = {
            **timing, **stability.host_noise([m.noise for m in ranks]),
            "step_ms_p10": percentile(steps, 10), "step_ms_p90": percentile(steps, 90),
            "fwd_ms": statistics.median(_per_step(ranks, "fwd_ms")),
            "bwd_ms": statistics.median(_per_step(ranks, "bwd_ms")),
            "tokens_per_s": tokens_per_s, "tokens_per_s_per_rank": tokens_per_s / case.world,
            "attn_flops": sum(rank_flops),  # one step, all ranks: the pairs the kernels computed
            "attn_tflops": sum(rank_flops) / (step_ms / 1e3) / 1e12,
            "peak_mem_bytes": float(max(m.peak_mem_bytes for m in ranks)),
            "load_imbalance": (max(rank_flops) / statistics.mean(rank_flops)
                               if sum(rank_flops) > 0 else 1.0),
            "setup_s": self.setup_s, "run_s": self.run_s,
        }
        peak = peak_flops(str(ranks[0].extra.get("device_name", "cpu")), case.dtype)
        if peak is not None:
            out["mfu"] = out["attn_tflops"] * 1e12 / (peak * case.world)
        detail: dict[str, int] = {}
        for m in ranks:
            for key, value in _bytes_by_key(m).items():
                detail[key] = max(detail.get(key, 0), value)
        out.update({k: float(v) for k, v in sorted(detail.items())})
        out["bytes_intra"] = float(sum(link_bytes(m, "intra") for m in ranks))
        out["bytes_inter"] = float(sum(link_bytes(m, "inter") for m in ranks))
        out["bytes_total"] = out["bytes_intra"] + out["bytes_inter"]
        errors = [m.extra.get("errors") for m in ranks]
        if all(errors):  # an accuracy trial: each tensor's relative error (max over ranks)
            for name in errors[0]:
                out[f"err_{name}"] = max(e[name] for e in errors)
            out["err_max"] = max(out[f"err_{name}"] for name in errors[0])
        if isinstance(case, TrainCase):  # a model training trial: TGS, MFU, memory levers
            out.update(train_metrics(case, ranks, step_ms, str(ranks[0].extra.get("device_name", ""))))
        return out

    @property
    def unstable(self) -> str | None:
        """Why this trial's step time cannot be trusted (a wide interval, a busy host), or None."""
        return stability.unstable_reason(self.metrics())

    def to_dict(self) -> dict[str, Any]:
        """Strict JSON: the case, the outcome, the metrics and every rank's detail (an unlimited
        emulated bandwidth, float('inf'), becomes null)."""
        d = asdict(self)
        d["case"] = {**asdict(self.case), "options": dict(self.case.options)}
        d["per_rank"] = [m.to_dict() for m in self.per_rank]
        d["metrics"] = self.metrics()
        d["failure"] = self.failure.value if self.failure is not None else None
        return _finite(d)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
