"""Options every command shares, set once by the app callback (`seqpar --address ... sweep ...`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the real imports wait until a command needs them: --help stays instant
    from seqpar.platform.tracking import Tracker
    from seqpar.workers.trial import TrialRunner


@dataclass
class Globals:
    address: str | None = None       # Ray: None = an embedded local Ray; "auto" / "ray://..." joins
    tracking_uri: str | None = None  # MLflow: None = MLFLOW_TRACKING_URI or sqlite:///./mlflow.db


GLOBALS = Globals()


def tracker(existing: bool = False) -> Tracker:
    """The MLflow tracker for this invocation (created only when a command needs it; a command
    that reads opens only an `existing` store: none is made where there is none)."""
    from seqpar.platform.tracking import Tracker

    return Tracker(GLOBALS.tracking_uri, existing=existing)


def trial_runner(device: str | None = None) -> TrialRunner:
    """A Ray TrialRunner on --address (an embedded local Ray by default)."""
    from seqpar.workers.trial import TrialRunner

    return TrialRunner(GLOBALS.address, device=device)
