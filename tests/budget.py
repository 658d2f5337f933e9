"""Where the suite's time goes, on a busy machine too (docs/development.md, "The budget"):
`SEQPAR_TEST_BUDGET=FILE make test` writes one JSON line per test to FILE (its wall seconds and
the CPU seconds of this process and of every process it started: the gang's ranks, Ray's daemons
and actors, the subprocesses) and prints the CPU by folder at the end. Wall seconds follow the
machine's load; CPU seconds do not (on 2 quiet cores, a test's wall is about its CPU, less where
ranks run side by side, more where it waits).

A process is counted at its last sample (every 0.5 s) even after it died unreaped (Ray's actors
are killed with their raylet's children); one that lived less than a sample and was not this
process's own child is missed.

Under pytest-xdist (`make test`: two workers) each worker meters its own tests and appends to
FILE; the controller gathers their rows and prints the summary, its session line counting every
worker and what they started."""

from __future__ import annotations

import json
import os
import threading
import time
from collections import defaultdict

import psutil
import pytest

BUDGET_ENV_VAR = "SEQPAR_TEST_BUDGET"
SAMPLE_S = 0.5
ROWS_KEY = "seqpar_budget"  # a pytest-xdist worker's rows, in its workeroutput


class Meter:
    """The CPU seconds this process and its descendants have used, sampled (`total`)."""

    def __init__(self) -> None:
        self.me = psutil.Process()
        # (pid, start time) -> (parent pid, own CPU s, its reaped children's CPU s), last seen
        self.last: dict[tuple[int, float], tuple[int, float, float]] = {}
        self.lock = threading.Lock()

    def total(self) -> float:
        """This process, every descendant at its last sample, and this process's reaped children
        beyond what their last samples counted (children too short-lived to be seen)."""
        try:
            procs = self.me.children(recursive=True)
        except psutil.Error:
            procs = []
        with self.lock:
            alive = set()
            for p in procs:
                try:
                    with p.oneshot():
                        key, t, ppid = (p.pid, p.create_time()), p.cpu_times(), p.ppid()
                except psutil.Error:
                    continue
                self.last[key] = (ppid, t.user + t.system, t.children_user + t.children_system)
                alive.add(key)
            mine = self.me.cpu_times()
            seen = sum(own for _, own, _ in self.last.values())
            gone = sum(own + kids for key, (ppid, own, kids) in self.last.items()
                       if key not in alive and ppid == self.me.pid)
        reaped = mine.children_user + mine.children_system
        return mine.user + mine.system + seen + max(0.0, reaped - gone)

    def run(self) -> None:
        while True:
            time.sleep(SAMPLE_S)
            self.total()


def host_busy_s() -> float:
    """CPU seconds the whole host has been busy (every process, every core)."""
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


class Budget:
    """The pytest plugin: a test's phases timed and metered, one line per test."""

    def __init__(self, path: str) -> None:
        self.path, self.meter, self.rows, self.workers = path, Meter(), [], 0
        self.started = (time.monotonic(), self.meter.total(), host_busy_s())
        threading.Thread(target=self.meter.run, daemon=True, name="budget-meter").start()

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None):
        cpu, wall = self.meter.total(), time.monotonic()
        try:
            return (yield)
        finally:
            row = {"test": item.nodeid, "cpu_s": round(self.meter.total() - cpu, 2),
                   "wall_s": round(time.monotonic() - wall, 2), "load": os.getloadavg()[0],
                   "ended": round(time.time(), 1),  # when, and where: the timeline of workers
                   "worker": os.environ.get("PYTEST_XDIST_WORKER", "")}
            self.rows.append(row)
            with open(self.path, "a") as f:
                f.write(json.dumps(row) + "\n")

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(session.config, "workeroutput"):  # a pytest-xdist worker: to the controller
            session.config.workeroutput[ROWS_KEY] = self.rows

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        """A pytest-xdist worker ended (on the controller): its rows join the summary."""
        self.rows.extend(getattr(node, "workeroutput", {}).get(ROWS_KEY, []))
        self.workers += 1

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.rows:
            return
        by = defaultdict(lambda: [0, 0.0, 0.0])
        for r in self.rows:
            folder = "/".join(r["test"].split("/")[:2])
            by[folder][0] += 1
            by[folder][1] += r["cpu_s"]
            by[folder][2] += r["wall_s"]
        cpu, wall = sum(r["cpu_s"] for r in self.rows), sum(r["wall_s"] for r in self.rows)
        load = sum(r["load"] for r in self.rows) / len(self.rows)
        write = terminalreporter.write_line
        workers = f", {self.workers} pytest-xdist workers side by side" if self.workers else ""
        write(f"budget: {len(self.rows)} tests, {cpu:.0f} CPU s, {wall:.0f} wall s{workers} "
              f"(mean load {load:.1f} on {os.cpu_count()} cores; every test in {self.path})")
        (w0, c0, h0), w1, c1 = self.started, time.monotonic(), self.meter.total()
        others = (host_busy_s() - h0 - (c1 - c0)) / ((w1 - w0) * (os.cpu_count() or 1))
        write(f"  the session: {w1 - w0:.0f} wall s, {c1 - c0:.0f} CPU s (collection and set-ups "
              f"included); other processes took {max(0.0, others):.0%} of the host meanwhile")
        for folder, (n, c, w) in sorted(by.items(), key=lambda kv: -kv[1][1]):
            write(f"  {folder:18} {n:5} tests {c:7.1f} CPU s {w:7.1f} wall s")


def configure(config: pytest.Config) -> None:
    """Registers the plugin when SEQPAR_TEST_BUDGET names a file (tests/conftest.py calls it)."""
    path = os.environ.get(BUDGET_ENV_VAR)
    if path:
        config.pluginmanager.register(Budget(path), "seqpar-budget")
