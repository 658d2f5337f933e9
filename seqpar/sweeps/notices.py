"""What the driver says while a sweep runs, besides its progress bar (`progress`): each trial's
line (`trial_line`), the published trial counts (`TrialCounts`) and the artifacts that could not
be written (`MissingArtifacts`).

While it runs the driver publishes `seqpar_sweep_trials` (done, failed, pending; platform.metrics).
Artifacts (per-rank JSON, figures, the page, the sweep file) that cannot be written cost nothing
else: the first is a warning naming where it was to go and why, the sweep goes on with every trial
FINISHED as measured (its per-rank medians are in the run itself), and the end lists what is missing
(`seqpar report <id>` draws the figures again once the store has room).
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape

from seqpar.platform import metrics
from seqpar.platform.tracking import Tracker
from seqpar.sweeps import report
from seqpar.workers.trial import TrialResult


def trial_line(result: TrialResult, label: str, attempts: int, count: str = "") -> str:
    """The trial's line; `count` (a long sweep's `[12/1000]`) at its end."""
    return _text(result, label, attempts) + (f"  [dim]{count}[/dim]" if count else "")


def _text(result: TrialResult, label: str, attempts: int) -> str:
    if result.status != "FINISHED":
        return (f"[red]✗[/red] {escape(label)}  FAILED after {attempts} attempt(s): "
                f"{escape(str(result.cause))}")
    m = result.metrics
    line = (f"[green]✓[/green] {escape(label)}  step {report.cell('step_ms', m['step_ms'])} ms "
            f"({report.cell('step_ms', m['step_ms_ci_low'])}-"
            f"{report.cell('step_ms', m['step_ms_ci_high'])})  "
            f"{report.cell('tokens_per_s', m['tokens_per_s'])} tok/s  "
            f"peak {report.metric_text('peak_mem_bytes', m['peak_mem_bytes'])}")
    reason = result.unstable
    return line + (f"  [yellow]unstable[/yellow]: {escape(reason)}" if reason else "")


class TrialCounts:
    """The driver's `seqpar_sweep_trials` (done, failed, pending), published while the sweep
    runs; a sweep outside Ray (no driver to publish from) publishes nothing."""

    def __init__(self, sweep: str, done: int, pending: int):
        self.sweep, self.counts = sweep, {"done": done, "failed": 0, "pending": pending}
        self.publisher = metrics.Publisher() if _ray_up() else None
        self._publish()

    def ended(self, ok: bool, per_min: float | None = None, left_s: float | None = None) -> None:
        """A trial ended; with the sweep's pace (trials a minute) and the time left, when known
        (`seqpar cluster status` shows them)."""
        self.counts["done" if ok else "failed"] += 1
        self.counts["pending"] -= 1
        self._publish()
        if self.publisher is not None:
            for name, value in (("seqpar_sweep_trials_per_min", per_min),
                                ("seqpar_sweep_left_s", left_s)):
                if value is not None:
                    self.publisher.set(name, value, {"sweep": self.sweep})

    def _publish(self) -> None:
        if self.publisher is not None:
            for status, n in self.counts.items():
                self.publisher.set("seqpar_sweep_trials", n,
                                   {"sweep": self.sweep, "status": status})

    def close(self) -> None:
        if self.publisher is not None:
            self.publisher.close()


def _ray_up() -> bool:
    try:
        import ray
    except ImportError:
        return False
    return ray.is_initialized()


class MissingArtifacts:
    """What the sweep says about artifacts that could not be written (`Tracker.missing`): one
    warning, the first time, naming where and why; at the end, the list."""

    def __init__(self, tracker: Tracker, console: Console):
        self.tracker, self.console = tracker, console
        self.first = len(tracker.missing)  # a tracker shared with earlier sweeps: theirs aside
        self.warned = False

    @property
    def missing(self) -> list[Any]:
        return self.tracker.missing[self.first:]

    def check(self) -> None:
        if self.missing and not self.warned:
            self.warned = True
            m = self.missing[0]
            self.console.print(
                f"[yellow]warning:[/yellow] artifact {escape(m.where)} not written: "
                f"{escape(m.error)}; measurements still go to the store, missing artifacts are "
                "listed at the end", highlight=False, soft_wrap=True)

    def summary(self, sweep_id: str) -> None:
        missing = self.missing
        if not missing:
            return
        per_rank = sum(m.path == "per_rank.json" for m in missing)
        others = sorted({m.path for m in missing if m.path != "per_rank.json"})
        parts = ([f"per_rank.json of {per_rank} trial(s) (their per-rank medians are in the "
                  "runs: rank_step_ms, rank_flops)"] if per_rank else []) + others
        self.console.print(
            f"[yellow]{len(missing)} artifact(s) missing[/yellow] ({escape(missing[-1].error)}): "
            f"{escape(', '.join(parts))}; once the artifact store has room, "
            f"`seqpar report {sweep_id}` draws the figures and the page again", highlight=False,
            soft_wrap=True)


