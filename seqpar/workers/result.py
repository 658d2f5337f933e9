"""A trial's outcome on the whole gang: the trial as it ran, FINISHED or FAILED (with its cause and
kind), every rank's record, and the metrics the driver computed once from them
(`workers.metrics.TrialMetrics`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

from seqpar.case import Case, TrainCase, Trial
from seqpar.workers.measure.record import RankMeasurement
from seqpar.workers.metrics import TrialMetrics, finite


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
    trial: Trial
    status: str  # "FINISHED" | "FAILED"
    cause: str | None
    per_rank: list[RankMeasurement]
    node_of_rank: list[int]
    setup_s: float  # gang (start or reuse) + rendezvous
    run_s: float    # the trial on every rank, process group included
    device: str
    topology: str = "virtual"  # "virtual" nodes on one machine | "real" Ray nodes
    gang_reused: bool = False
    failure: FailureKind | None = None  # set exactly when status is FAILED
    metrics: TrialMetrics = field(default_factory=TrialMetrics)  # empty unless FINISHED

    @property
    def ok(self) -> bool:
        return self.status == "FINISHED"

    @property
    def case(self) -> Case | TrainCase:
        return self.trial.case

    @property
    def unstable(self) -> str | None:
        """Why this trial's step time cannot be trusted (a wide interval, a busy host, mixed
        kernels), or None."""
        return self.metrics.unstable

    def finish(self, per_rank: list[RankMeasurement]) -> None:
        """Every rank reported: FINISHED, and the metrics computed, once."""
        self.per_rank, self.status = per_rank, "FINISHED"
        self.metrics = TrialMetrics.of(self.trial, per_rank, setup_s=self.setup_s, run_s=self.run_s)

    def to_dict(self) -> dict[str, Any]:
        """Strict JSON (per_rank.json): the case, the placement, the outcome, the metrics and every
        rank's detail (an unlimited emulated bandwidth, float('inf'), becomes null)."""
        t = self.trial
        d: dict[str, Any] = {
            "case": {**asdict(t.case), "options": dict(t.case.options)},
            "placement": {"gang_id": t.gang_id, "nodes": t.nodes,
                          "ranks_per_node": t.ranks_per_node, "timeout_s": t.timeout_s,
                          "env_vars": t.env, "link_emulation": {
                              k: asdict(m) for k, m in t.links} or None},
            "status": self.status, "cause": self.cause, "node_of_rank": self.node_of_rank,
            "setup_s": self.setup_s, "run_s": self.run_s, "device": self.device,
            "topology": self.topology, "gang_reused": self.gang_reused,
            "failure": self.failure.value if self.failure is not None else None,
            "per_rank": [m.to_dict() for m in self.per_rank],
        }
        return {**finite(d), "metrics": self.metrics.to_dict()}

