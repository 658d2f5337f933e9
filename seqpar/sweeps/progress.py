"""What a running sweep shows: trials done/total (and how many were unstable), the pace in trials a
minute, elapsed, ETA, and the current trial's phase.

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

import collections
import statistics
import threading
import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn

from seqpar import planner
from seqpar.planner import clusters
from seqpar.platform import cluster

LONG_SWEEP = 50    # trials from which each trial's line ends with the count, pace and time left
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
    """Remaining seconds of a sweep from predictions calibrated by the trials done so far; O(1)
    a trial whatever the sweep's size (the calibration: the median of the last RECENT trials)."""

    RECENT = 200

    def __init__(self, predictions: list[float | None]):
        self.pending = collections.deque(predictions)
        self.unknown = sum(p is None for p in predictions)  # pending trials it cannot predict
        self.predicted = sum(p for p in predictions if p is not None)  # their predictions' sum
        self.ratios: collections.deque[float] = collections.deque(maxlen=self.RECENT)
        self.durations: collections.deque[float] = collections.deque(maxlen=self.RECENT)
        self.done_n = 0

    def done(self, seconds: float) -> None:
        predicted = None
        if self.pending:
            predicted = self.pending.popleft()
            if predicted is None:
                self.unknown -= 1
            else:
                self.predicted -= predicted
        self.done_n += 1
        self.durations.append(seconds)
        if predicted:
            self.ratios.append(seconds / predicted)

    def remaining_s(self) -> float | None:
        if not self.pending:
            return 0.0
        if self.unknown == 0 and (self.ratios or not self.durations):
            scale = statistics.median(self.ratios) if self.ratios else 1.0
            return scale * max(0.0, self.predicted)
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
                 poll_s: float = 1.0, done: int = 0):
        """`done`: trials a resumed sweep had finished before (counted in the total)."""
        self.enabled, self.gang_id, self.poll_s = enabled, gang_id, poll_s
        self.before, self.total = done, done + len(specs)
        self.eta = Eta([predicted_s(s) for s in specs])
        self._t0 = time.monotonic()
        self._trial_t0: float | None = None
        self.bar = Progress(TextColumn("{task.fields[left]}"), BarColumn(bar_width=20),
                            TextColumn("{task.fields[right]}"), console=console, transient=True)
        self.task = self.bar.add_task("", total=len(specs), left=f"trials {done}/{self.total}",
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
        """Pace, elapsed and ETA; the ETA counts down while a trial runs (never below 0)."""
        now = time.monotonic()
        left = self.eta.remaining_s()
        if left is not None and self._trial_t0 is not None:
            left = max(0.0, left - (now - self._trial_t0))
        rate = self.rate_per_min()
        pace = f"{rate:.1f} trials/min  " if rate is not None else ""
        return f"{pace}elapsed {_clock(now - self._t0)}  ETA {_clock(left)}"

    def rate_per_min(self) -> float | None:
        """Trials this session ran a minute (None before the first ends)."""
        ran = self.eta.done_n
        elapsed = time.monotonic() - self._t0
        return 60.0 * ran / elapsed if ran and elapsed > 0 else None

    def count(self) -> str:
        """`[12/1000 done, 9.5/min, 1:43:10 left]` for a trial's line in a long sweep (its
        progress without a live bar: a pipe, a CI log); '' for a short one (LONG_SWEEP trials)."""
        if self.total < LONG_SWEEP:
            return ""
        rate = self.rate_per_min()
        pace = f", {rate:.1f}/min" if rate is not None else ""
        return (f"[{self.before + self.eta.done_n}/{self.total} done{pace}, "
                f"{_clock(self.eta.remaining_s())} left]")

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
        done = self.before + int(self.bar.tasks[0].completed) + 1
        shaky = f", {self.unstable} unstable" if self.unstable else ""
        self.bar.update(self.task, advance=1,
                        left=f"trials {done}/{self.total}{shaky}",
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
