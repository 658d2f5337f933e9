"""The docs test's local Ray head (make test-full) and its summary line: how many of the manual's
commands ran, how many were skipped and why, how many wait for make test-full."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest

BIN = Path(sys.executable).parent
_outcomes: Counter[str] = Counter()
_skipped: list[str] = []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_head():
    """A `ray start --head --block` of our own on free ports in a temp dir (never `ray stop`,
    which would stop every Ray on the machine): its GCS and dashboard addresses."""
    temp = tempfile.mkdtemp(prefix="sp-docs-")  # short: Ray's socket paths must fit 107 bytes
    port, dashboard = _free_port(), _free_port()
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI", "RAY_AUTH_MODE")}
    head = subprocess.Popen(
        [str(BIN / "ray"), "start", "--head", "--block", f"--port={port}", "--num-cpus=4",
         f"--temp-dir={temp}", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
         f"--dashboard-port={dashboard}", f"--dashboard-agent-listen-port={_free_port()}",
         f"--ray-client-server-port={_free_port()}", f"--metrics-export-port={_free_port()}",
         f"--runtime-env-agent-port={_free_port()}", "--disable-usage-stats"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    ours: dict[tuple[int, float], psutil.Process] = {}
    try:
        deadline = time.monotonic() + 120
        while True:  # up when the GCS and the dashboard answer and the raylet's agents exist
            ours.update({(p.pid, p.create_time()): p
                         for p in psutil.Process(head.pid).children(recursive=True)})
            try:
                for p in (port, dashboard):
                    socket.create_connection(("127.0.0.1", p), timeout=1).close()
                up = any("RuntimeEnvAgent" in " ".join(p.cmdline()) for p in ours.values()
                         if p.is_running())
            except (OSError, psutil.Error):
                up = False
            if up:
                break
            assert head.poll() is None and time.monotonic() < deadline, "ray start failed"
            time.sleep(0.5)
        yield {"gcs": f"127.0.0.1:{port}", "dashboard": f"http://127.0.0.1:{dashboard}"}
    finally:
        if head.poll() is None:
            ours.update({(p.pid, p.create_time()): p
                         for p in psutil.Process(head.pid).children(recursive=True)})
        head.send_signal(signal.SIGTERM)  # `ray start --block` stops its own processes
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            head.kill()
        _, alive = psutil.wait_procs([p for p in ours.values() if p.is_running()], timeout=10)
        for p in alive:  # only what this head started
            p.kill()
        shutil.rmtree(temp, ignore_errors=True)


def _is_ours(report: pytest.TestReport) -> bool:
    """A test that runs (or skips) commands or blocks of the pages, not the parse or rule tests."""
    return report.nodeid.startswith("tests/docs/") and ("[" in report.nodeid
                                                         or "ray_job" in report.nodeid)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if not _is_ours(report):
        return
    if report.when == "call":  # a test of several lines says how many (record_property)
        lines = dict(report.user_properties).get("commands", 1)
        _outcomes["ran"] += lines
        _outcomes["failed"] += lines if report.failed else 0
    elif report.skipped and report.when == "setup":
        _outcomes["skipped"] += 1
        _skipped.append(str(report.longrepr[-1]).removeprefix("Skipped: "))


def pytest_deselected(items: list[pytest.Item]) -> None:
    _outcomes["full"] += sum(1 for i in items if i.nodeid.startswith("tests/docs/")
                             and i.get_closest_marker("slow"))


def pytest_terminal_summary(terminalreporter) -> None:
    if not (_outcomes["ran"] or _outcomes["skipped"]):
        return
    from tests.docs.test_docs_commands import SEQPAR

    terminalreporter.write_line(
        f"docs: {_outcomes['ran']} of the manual's commands and Python blocks ran "
        f"({_outcomes['failed']} failed), {len(SEQPAR)} seqpar lines parsed, "
        f"{_outcomes['skipped']} skipped, {_outcomes['full']} left to make test-full")
    for reason in _skipped:
        terminalreporter.write_line(f"  skipped {reason}")
