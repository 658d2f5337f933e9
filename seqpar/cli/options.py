"""What every command shares, made once by the app callback (`seqpar --address ... sweep ...`) and
passed down in typer's context object (`ctx.obj`): no module state."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import typer

try:  # typer >= 0.22 vendors click
    from typer._click.globals import get_current_context
except ImportError:
    from click import get_current_context

if TYPE_CHECKING:  # the runner (torch, Ray) and the tracker wait until a command needs them:
    # --help stays instant, and a plan reads no store
    from seqpar.platform.tracking import Tracker
    from seqpar.workers.trial import TrialRunner


@dataclass(frozen=True)
class Settings:
    address: str | None = None       # Ray: None = an embedded local Ray; "auto" / "ray://..." joins
    tracking_uri: str | None = None  # MLflow: None = MLFLOW_TRACKING_URI or sqlite:///./mlflow.db

    @classmethod
    def of(cls, ctx: typer.Context | None = None) -> Settings:
        """The settings the app callback put in the (root) context: of `ctx`, else of the command
        running now; the defaults outside a command (a direct call, a test)."""
        ctx = ctx if ctx is not None else get_current_context(silent=True)
        found = ctx.find_root().obj if ctx is not None else None
        return found if isinstance(found, Settings) else cls()


def tracker(settings: Settings | None = None, existing: bool = False) -> Tracker:
    """The MLflow tracker of these settings (created only when a command needs it; a command
    that reads opens only an `existing` store: none is made where there is none)."""
    from seqpar.platform.tracking import Tracker

    return Tracker((settings or Settings.of()).tracking_uri, existing=existing)


def trial_runner(settings: Settings | None = None, device: str | None = None,
                 job_metadata: dict[str, str] | None = None) -> TrialRunner:
    """A Ray TrialRunner on the settings' --address (an embedded local Ray by default); its Ray job
    labelled with `job_metadata` (`ray list jobs --detail`)."""
    from seqpar.workers.trial import TrialRunner  # torch and Ray: only for a command that runs

    return TrialRunner((settings or Settings.of()).address, device=device,
                       job_metadata=job_metadata)
