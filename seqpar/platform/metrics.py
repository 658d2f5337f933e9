"""seqpar's Prometheus series: their names and tags (one place), publishing them through
`ray.util.metrics`, and reading them back from the nodes' metrics endpoints.

Every node's Ray agent serves what the processes on it publish at
`http://<node ip>:<MetricsExportPort>/metrics`, with Ray's prefix (`ray_seqpar_step_ms`; a counter
also gets `_total`). Ray keeps a gauge only while its process sets it again: a value not set for
two export intervals (`metrics_report_interval_ms`, 10 s by default) is dropped. So a `Publisher`
sets what it holds again every PUBLISH_S, from a thread of its own. Tag values must be ASCII (Ray
refuses the rest), and a name Ray does not accept is dropped without an error, which is why the
tests read every series back from an endpoint.

    ranks (workers.rank_worker)   seqpar_trial_iterations, seqpar_rank_phase while a trial runs;
                                  the results when it ends (step, tokens/s, peak memory, bytes)
    driver (sweeps.notices)       seqpar_sweep_trials: done | failed | pending of the sweep; its
                                  pace (seqpar_sweep_trials_per_min) and time left (seqpar_sweep_left_s)

A Grafana dashboard of them ships beside this module (`GRAFANA_DASHBOARD`, Ray's JSON format).

Every series carries `sweep`: the sweep's id8 (the gang id `sweep-<id8>` without its prefix; any
other gang id as it is), and every per-trial series `trial` (`trial_tag`: short label and spec
hash).
"""

from __future__ import annotations

import re
import threading
import time
import unicodedata
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GRAFANA_DASHBOARD = Path(__file__).with_name("grafana") / "seqpar_grafana_dashboard.json"
PREFIX = "ray_"          # what Ray's exporter puts before every name
PUBLISH_S = 1.0          # how often a Publisher sets its gauges again
ENDED_KEEP_S = 30.0      # how long the zeros of a trial that ended stay published
SWEEP_GANG_PREFIX = "sweep-"

# the phases a rank reports (workers.rank_worker): the trial's set-up, its loop (`train` for
# training steps, `memory` for training's one extra forward that measures activations), publishing
PHASES = ("idle", "rendezvous", "measure", "train", "memory", "report")
STATUSES = ("done", "failed", "pending")
NO_TRIAL = "none"        # the trial tag of a rank between trials (phase idle)

RESULT_TAGS = ("gang", "sweep", "trial", "algorithm", "rank")
PROGRESS_TAGS = ("sweep", "trial", "rank")
PHASE_TAGS = ("sweep", "trial", "rank", "phase")
SWEEP_TAGS = ("sweep", "status")
PACE_TAGS = ("sweep",)


@dataclass(frozen=True)
class Series:
    name: str
    kind: str  # "gauge" | "counter"
    tags: tuple[str, ...]
    help: str

    @property
    def exported(self) -> str:
        """The name Prometheus sees."""
        return PREFIX + self.name + ("_total" if self.kind == "counter" else "")


SERIES = {s.name: s for s in (
    Series("seqpar_step_ms", "gauge", RESULT_TAGS, "median step time of the rank's last trial"),
    Series("seqpar_tokens_per_s", "gauge", RESULT_TAGS,
           "tokens per second (whole sequence) of the rank's last trial"),
    Series("seqpar_peak_mem_bytes", "gauge", RESULT_TAGS, "peak memory of the rank's last trial"),
    Series("seqpar_bytes_sent", "counter", RESULT_TAGS,
           "bytes this rank sent in timed iterations"),
    Series("seqpar_trials", "counter", RESULT_TAGS, "trials this rank ran"),
    Series("seqpar_trial_iterations", "gauge", PROGRESS_TAGS,
           "iterations done (warm-up included) of the trial the rank is running"),
    Series("seqpar_rank_phase", "gauge", PHASE_TAGS,
           "1 for the phase the rank is in, 0 for the others"),
    Series("seqpar_sweep_trials", "gauge", SWEEP_TAGS,
           "trials of the sweep by status (done, failed, pending)"),
    Series("seqpar_sweep_trials_per_min", "gauge", PACE_TAGS,
           "trials the sweep's driver ran a minute (this session)"),
    Series("seqpar_sweep_left_s", "gauge", PACE_TAGS,
           "the sweep's estimated time left, seconds"),
)}


def sweep_tag(gang_id: str) -> str:
    """The `sweep` tag of a gang: `sweep-1a2b3c4d` -> `1a2b3c4d`; another gang id as it is."""
    return ascii_tag(gang_id.removeprefix(SWEEP_GANG_PREFIX))


def ascii_tag(text: str) -> str:
    """`text` as a tag value Ray takes: ASCII (accents dropped, anything else as '?')."""
    plain = unicodedata.normalize("NFKD", text)
    return "".join(c for c in plain if not unicodedata.combining(c)).encode(
        "ascii", "replace").decode("ascii")


def trial_tag(label: str, spec_hash: str | None = None, width: int = 48) -> str:
    """A trial's name in the dashboard and its `trial` tag: its label cut to `width` characters
    and its spec hash, e.g. `ring P=4 zigzag causal N=4096 H=8/8 bfl 3f2a9c01b2d4`."""
    short = ascii_tag(" ".join(label.split()))
    short = short if len(short) <= width else short[:width].rstrip()
    return f"{short} {spec_hash}" if spec_hash else short


class Publisher:
    """The series one process publishes, set again every PUBLISH_S from a daemon thread so Ray
    keeps them (see the module docstring). `ray.util.metrics` objects are made on first use.
    A value given `keep_s` stops being published that long after it was last set."""

    def __init__(self, publish_s: float = PUBLISH_S):
        self.publish_s = publish_s
        self._metrics: dict[str, Any] = {}
        self._values: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[float, float | None]] = {}
        self._followed: dict[tuple[str, tuple[tuple[str, str], ...]], Callable[[], float]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: str | None = None  # the last failure to publish (the metrics agent can be down)

    def _metric(self, name: str) -> Any:
        if name not in self._metrics:
            from ray.util import metrics

            s = SERIES[name]
            cls = metrics.Counter if s.kind == "counter" else metrics.Gauge
            self._metrics[name] = cls(name, s.help, tag_keys=s.tags)
        return self._metrics[name]

    def set(self, name: str, value: float, tags: dict[str, str], keep_s: float | None = None
            ) -> None:
        """A gauge's value, published now and kept published (for `keep_s`, or until replaced)."""
        key = (name, tuple(sorted(tags.items())))
        until = time.monotonic() + keep_s if keep_s is not None else None
        with self._lock:
            self._values[key] = (float(value), until)
        self._publish([(name, dict(key[1]), float(value))])
        self._start()

    def follow(self, name: str, tags: dict[str, str], read: Callable[[], float]) -> None:
        """Publish `read()` as the gauge's value every PUBLISH_S (a counter the caller bumps
        cheaply, e.g. iterations done), until `unfollow`, which publishes its last value once more
        and keeps it published for ENDED_KEEP_S."""
        with self._lock:
            self._followed[(name, tuple(sorted(tags.items())))] = read
        self._publish([(name, tags, float(read()))])
        self._start()

    def unfollow(self, name: str, tags: dict[str, str]) -> None:
        with self._lock:
            read = self._followed.pop((name, tuple(sorted(tags.items()))), None)
        if read is not None:
            self.set(name, float(read()), tags, keep_s=ENDED_KEEP_S)

    def drop(self, name: str, **match: str) -> None:
        """Stop publishing `name`'s values whose tags include `match` (Ray drops them later)."""
        with self._lock:
            for key in [k for k in self._values if k[0] == name
                        and all(dict(k[1]).get(t) == v for t, v in match.items())]:
                del self._values[key]

    def inc(self, name: str, value: float, tags: dict[str, str]) -> None:
        """A counter (Ray keeps counters: nothing to set again)."""
        if value > 0:  # Ray's Counter.inc refuses 0
            try:
                self._metric(name).inc(value, tags=tags)
            except Exception as err:  # a metrics hiccup never fails a measurement
                self.error = f"{type(err).__name__}: {err}"

    def _publish(self, items: Iterable[tuple[str, dict[str, str], float]]) -> None:
        for name, tags, value in items:
            try:
                self._metric(name).set(value, tags=tags)
            except Exception as err:
                self.error = f"{type(err).__name__}: {err}"

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="seqpar-metrics", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.publish_s):
            now = time.monotonic()
            with self._lock:
                for key in [k for k, (_, until) in self._values.items()
                            if until is not None and until < now]:
                    del self._values[key]
                items = [(n, dict(t), v) for (n, t), (v, _) in self._values.items()]
                followed = list(self._followed.items())
            items += [(n, dict(t), float(read())) for (n, t), read in followed]
            self._publish(items)

    def close(self) -> None:
        self._stop.set()


# ------------------------------------------------------------------------------- reading back
LINE = re.compile(r'^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<tags>.*)\})?\s+(?P<value>\S+)')
TAG = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Sample:
    name: str             # as exported (`ray_seqpar_rank_phase`)
    tags: dict[str, str]
    value: float


def parse(text: str, prefix: str = PREFIX + "seqpar_") -> list[Sample]:
    """The samples of Prometheus text whose names start with `prefix`."""
    out = []
    for line in text.splitlines():
        if not line.startswith(prefix):
            continue
        m = LINE.match(line)
        if m is None:
            continue
        tags = {k: v.replace('\\"', '"').replace("\\\\", "\\")
                for k, v in TAG.findall(m.group("tags") or "")}
        try:
            out.append(Sample(m.group("name"), tags, float(m.group("value"))))
        except ValueError:
            continue
    return out


def endpoints(nodes: list[dict[str, Any]]) -> list[str]:
    """The metrics endpoint of each node (`ray.nodes()` entries)."""
    return [f"http://{n['NodeManagerAddress']}:{n['MetricsExportPort']}/metrics"
            for n in nodes if n.get("MetricsExportPort")]


def scrape(urls: Iterable[str], timeout_s: float = 5.0) -> list[Sample]:
    """seqpar's samples from every endpoint that answers."""
    out: list[Sample] = []
    for url in urls:
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as reply:
                out += parse(reply.read().decode("utf-8", "replace"))
        except OSError:  # a node going away: the others still count
            continue
    return out
