"""What a running sweep shows: trials done/total (and how many were unstable), elapsed, ETA, and the
current trial's phase.

    live = SweepProgress(console, trials=[p.spec for p in todo], gang_id=gang_id)
    with live:
        live.start_trial(spec, label)   # polls rank 0's heartbeat (warm-up / timed iterations)
        ...
        live.end_trial(seconds, unstable=False)

The ETA comes from the cost model while it can predict (`predicted_s`, scaled by how far the
finished trials were from its predictions), else from the mean time of the trials done so far.
The current trial's phase and iterations done are rank 0's heartbeat (`rendezvous`, `measure`,
`train`, `memory`, `report`): the rank actor answers it on its second thread while the trial runs.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn

from seqpar import planner
from seqpar.planner import clusters
from seqpar.platform import cluster

GANG_START_S = 3.0  # a trial's fixed cost beside its iterations (gang reuse, rendezvous, logging)


def predicted_s(spec: Any) -> float | None:
    """The cost model's wall time for one trial (warm-up, memory and timed iterations), or None
    when it cannot predict this spec. The one place this module calls the cost model."""
    try:
        where = clusters.load("local" if spec.env.device in ("cpu", "auto") else
                              "loongtrain-a100")
        step_s = planner.predict_spec(spec, where).attention_ms / 1e3
        w = spec.workload
        return GANG_START_S + step_s * (w.warmup + 1 + w.iters)
    except Exception:  # a spec the model cannot predict: an ETA is never worth a failed sweep
        return None


class Eta:
    """Remaining seconds of a sweep from predictions calibrated by the trials done so far."""

    def __init__(self, predictions: list[float | None]):
        self.pending = list(predictions)
        self.ratios: list[float] = []
        self.durations: list[float] = []

    def done(self, seconds: float) -> None:
        predicted = self.pending.pop(0) if self.pending else None
        self.durations.append(seconds)
        if predicted:
            self.ratios.append(seconds / predicted)

    def remaining_s(self) -> float | None:
        if not self.pending:
            return 0.0
        if all(p is not None for p in self.pending) and (self.ratios or not self.durations):
            scale = statistics.median(self.ratios) if self.ratios else 1.0
            return scale * sum(p for p in self.pending if p is not None)
        if self.durations:
            return statistics.mean(self.durations) * len(self.pending)
        return None


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class SweepProgress:
    """A rich live display of the sweep (see the module docstring); a no-op when `enabled` is
    False."""

    def __init__(self, console: Console, specs: list[Any], gang_id: str, enabled: bool = True,
                 poll_s: float = 1.0):
        self.enabled, self.gang_id, self.poll_s = enabled, gang_id, poll_s
        self.eta = Eta([predicted_s(s) for s in specs])
        self._t0 = time.monotonic()
        self._trial_t0: float | None = None
        self.bar = Progress(TextColumn("{task.fields[left]}"), BarColumn(bar_width=20),
                            TextColumn("{task.fields[right]}"), console=console, transient=True)
        self.task = self.bar.add_task("", total=len(specs), left=f"trials 0/{len(specs)}",
                                      right=self._overall())
        self.trial = self.bar.add_task("", total=None, left="", right="", visible=False)
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None
        self._label = ""
        self._iterations = ""
        self.unstable = 0  # trials whose step time is unstable (a wide interval, a busy host)

    def __enter__(self) -> SweepProgress:
        if self.enabled:
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._halt_poller()
        if self.enabled:
            self.bar.stop()

    def _overall(self) -> str:
        """Elapsed and ETA; the ETA counts down while a trial runs (never below 0)."""
        now = time.monotonic()
        left = self.eta.remaining_s()
        if left is not None and self._trial_t0 is not None:
            left = max(0.0, left - (now - self._trial_t0))
        return f"elapsed {_clock(now - self._t0)}  ETA {_clock(left)}"

    def start_trial(self, spec: Any, label: str) -> None:
        w = spec.workload
        self._label = label
        self._iterations = f"{w.warmup} warm-up + 1 memory + {w.iters} timed iterations"
        self._trial_t0 = time.monotonic()
        self.bar.update(self.trial, visible=True)
        self._show("starting")
        if self.enabled:
            self._stop.clear()
            self._poller = threading.Thread(target=self._poll, name="seqpar-progress", daemon=True)
            self._poller.start()

    def end_trial(self, seconds: float, unstable: bool = False) -> None:
        self._halt_poller()
        self.eta.done(seconds)
        self._trial_t0 = None
        self.unstable += unstable
        done = int(self.bar.tasks[0].completed) + 1
        shaky = f", {self.unstable} unstable" if self.unstable else ""
        self.bar.update(self.task, advance=1,
                        left=f"trials {done}/{self.bar.tasks[0].total:g}{shaky}",
                        right=self._overall())

    def _show(self, phase: str) -> None:
        self.bar.update(self.trial, left=f"  {phase:<12} {self._label}", right=self._iterations)
        self.bar.update(self.task, right=self._overall())

    def _halt_poller(self) -> None:
        self._stop.set()
        if self._poller is not None:
            self._poller.join(timeout=5)
            self._poller = None

    def _poll(self) -> None:
        """Rank 0's heartbeat once a second while the trial runs."""
        try:
            import ray
        except ImportError:
            return
        actor = None
        while not self._stop.wait(self.poll_s):
            try:
                if actor is None:
                    actor = ray.get_actor(cluster.actor_name(self.gang_id, 0),
                                          namespace=cluster.NAMESPACE)
                beat = ray.get(actor.heartbeat.remote(), timeout=self.poll_s)
                self._show(f"{beat['phase']} {beat['phase_s']:.0f}s "
                           f"{beat.get('iterations', 0)} it")
            except Exception:  # the gang is starting or was replaced: ask again next time
                actor = None
