"""A `ray start --head --block` of a test's own, on free ports in a temp dir (never `ray stop`,
which would stop every Ray on the machine), killed with everything it started: the local head the
platform and docs tests join (`ray_head` fixtures)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env() -> dict[str, str]:
    """This environment without what would point a child at another Ray or MLflow store, or fix
    its authentication mode (each child must find its cluster's own)."""
    return {k: v for k, v in os.environ.items()
            if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI", "RAY_AUTH_MODE")}


@contextlib.contextmanager
def local_ray_head(prefix: str, cpus: int) -> Iterator[dict[str, str]]:
    """The head's GCS address (`gcs`), Ray client address (`client`) and dashboard (`dashboard`),
    once its GCS and dashboard answer and the raylet's agents exist."""
    temp = tempfile.mkdtemp(prefix=prefix)  # short: Ray's socket paths must fit 107 bytes
    port, client_port, dashboard = free_port(), free_port(), free_port()
    head = subprocess.Popen(
        [str(BIN / "ray"), "start", "--head", "--block", f"--port={port}", f"--num-cpus={cpus}",
         f"--temp-dir={temp}", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
         f"--dashboard-port={dashboard}", f"--dashboard-agent-listen-port={free_port()}",
         f"--ray-client-server-port={client_port}", f"--metrics-export-port={free_port()}",
         f"--runtime-env-agent-port={free_port()}", "--disable-usage-stats"],
        env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    ours: dict[tuple[int, float], psutil.Process] = {}
    try:
        deadline = time.monotonic() + 120
        while True:
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
        time.sleep(2)  # the agents register with the GCS a moment after they start
        yield {"gcs": f"127.0.0.1:{port}", "client": f"ray://127.0.0.1:{client_port}",
               "dashboard": f"http://127.0.0.1:{dashboard}"}
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
