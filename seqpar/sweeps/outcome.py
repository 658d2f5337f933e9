"""What a sweep hands back (`SweepOutcome`: each trial as kept, a resume's earlier trials) and what
it keeps of each trial as it runs.

Memory stays bounded by what the report needs, whatever the sweep's size: once a trial is logged
the driver keeps its `TrialView` (the numbers and intervals the comparison, the report and the
figures read), not its ranks' records, its run's params or its per_rank.json, except for the few
trials whose per-rank breakdown or timeline the report draws (`DetailKeeper`,
`plots.detail_candidates`, at most a dozen). A resumed sweep reads its earlier trials back with one
search. What grew besides was native: glibc's malloc arenas, one a driver thread
(`platform.heap.bound_heap`, called before Ray starts, holds them to two; measured: 0.16 -> 0.04
MiB a trial).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from seqpar.experiments.grid import Point
from seqpar.platform.tracking import RunRecord
from seqpar.sweeps.report.plots import MAX_RANK_PANELS, config_ends, detail_candidates
from seqpar.sweeps.report.view import SweepView, TrialView
from seqpar.workers.trial import TrialResult


@dataclass
class TrialOutcome:
    """A trial as it ends (what `on_trial_end` sees): its whole result and its run as logged."""

    point: Point
    result: TrialResult
    run: RunRecord     # the run as it was logged
    attempts: int

    @property
    def run_id(self) -> str:
        return self.run.run_id


@dataclass(frozen=True)
class KeptTrial:
    """What the sweep keeps of a trial once it is logged: its view (the report's numbers)."""

    point: Point
    view: TrialView
    attempts: int
    failure: str | None  # the FailureKind's value when it FAILED

    @property
    def run_id(self) -> str:
        return self.view.run_id

    @property
    def status(self) -> str:
        return self.view.status


@dataclass
class SweepOutcome:
    sweep: SweepView
    trials: list[KeptTrial] = field(default_factory=list)
    resumed: int = 0                                        # trials skipped: already FINISHED
    earlier: list[TrialView] = field(default_factory=list)  # theirs, read back once
    kept: dict[str, dict[str, Any]] = field(default_factory=dict)  # run id -> per_rank.json

    @property
    def sweep_id(self) -> str:
        return self.sweep.sweep_id

    @property
    def experiment(self) -> str:
        return self.sweep.experiment

    @property
    def failed(self) -> list[KeptTrial]:
        return [t for t in self.trials if t.status != "FINISHED"]

    def views(self) -> list[TrialView]:
        """Every trial of the sweep: this session's as logged, and a resume's earlier ones."""
        return [t.view for t in self.trials] + self.earlier

    def details(self) -> dict[str, dict[str, Any]]:
        """run id -> per_rank.json of the trials whose breakdown the report draws (in memory)."""
        return dict(self.kept)


class DetailKeeper:
    """The per_rank.json of the trials the report's per-rank figures use (`detail_candidates`:
    at most a dozen), kept as the sweep runs; every other trial's is only in the store."""

    def __init__(self) -> None:
        self.views: list[TrialView] = []
        self.details: dict[str, dict[str, Any]] = {}
        self.seen = 0  # multi-rank trials offered: past MAX_RANK_PANELS only the ends are kept

    def offer(self, view: TrialView, result: TrialResult) -> None:
        if not view.finished or view.world < 2:
            return
        self.seen += 1
        offered = [*self.views, view]
        if self.seen <= MAX_RANK_PANELS:  # every one may be a panel yet
            wanted = {t.run_id for t in offered}
        else:  # each configuration's ends (the report's panels among them) and the timelines'
            wanted = {t.run_id for t in [*config_ends(offered), *detail_candidates(offered)]}
        if view.run_id not in wanted:
            return
        self.views = [t for t in [*self.views, view] if t.run_id in wanted]
        self.details = {k: v for k, v in self.details.items() if k in wanted}
        self.details[view.run_id] = result.to_dict()
