"""Browser tests: headless Chromium against the real MLflow UI, the HTML report and the Ray dashboard.

One small sweep runs once (on the session's embedded Ray) into a temporary store; while it runs the
Ray dashboard's actors page is captured; one `mlflow server` serves every MLflow page. Without a
`chromium` binary every browser test skips and says so (`apt-get install chromium`; `.ci/run`
installs it).
"""

from __future__ import annotations

import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")
# screenshots for docs/ (each costs a second page load): SEQPAR_SCREENSHOTS=1 pytest tests/ui
SCREENSHOTS = os.environ.get("SEQPAR_SCREENSHOTS") == "1"
MLFLOW_START_TIMEOUT_S = 240.0  # one worker; a loaded 2-core machine imports MLflow slowly


def browser() -> str | None:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture(scope="session")
def chromium() -> str:
    path = browser()
    if path is None:
        pytest.skip("headless Chromium not found (apt-get install chromium): browser tests skipped")
    return path


def run_chromium(binary: str, url: str, *, budget_ms: int = 20000, window: str = "1400,1000",
                 screenshot: Path | None = None, timeout_s: float = 180) -> str:
    """The DOM after the page settled (virtual time), or a screenshot when `screenshot` is set.
    Each call has a fresh profile: no local storage carries a view from one page to the next."""
    with tempfile.TemporaryDirectory(prefix="seqpar-chromium-") as profile:
        args = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--hide-scrollbars", "--no-first-run", f"--user-data-dir={profile}",
                f"--window-size={window}", f"--virtual-time-budget={budget_ms}"]
        args += [f"--screenshot={screenshot}"] if screenshot else ["--dump-dom"]
        out = subprocess.run(args + [url], capture_output=True, text=True, timeout=timeout_s)
    return out.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{url}: the server exited ({proc.returncode})")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise TimeoutError(f"{url} did not answer within {timeout_s:g} s")


class _TokenProxy(BaseHTTPRequestHandler):
    """Forwards to the Ray dashboard with `Authorization: Bearer <token>`: what the dashboard's
    login page does with the token `ray get-auth-token` prints (it keeps it as a cookie)."""

    target: tuple[str, int] = ("127.0.0.1", 8265)
    token: str | None = None

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        conn = http.client.HTTPConnection(*self.target, timeout=60)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        conn.request("GET", self.path, headers=headers)
        resp = conn.getresponse()
        body = resp.read()
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@dataclass
class UiSweep:
    uri: str
    sweep_id: str
    experiment_id: str
    trial_names: list[str]
    dashboard_dom: str = ""
    dashboard_seen_while_running: bool = False
    dashboard_url: str = ""
    timings: dict[str, float] = field(default_factory=dict)


SWEEP = {
    "name": "ui-test",
    "base": {"model": "tiny", "plan": {"world": 2, "layout": "zigzag"},
             "workload": {"causal": True, "batch": 1, "dtype": "float32", "mode": "fwd+bwd",
                          "warmup": 1, "iters": 2, "seq_len": 512},
             "env": {"device": "cpu"}},
}
# two lengths for the throughput plot; the last trial runs long enough (a few seconds) for the
# dashboard to be looked at while it runs
POINTS = [
    {"plan.algorithm": "local", "plan.world": 1, "workload.seq_len": 512},
    {"plan.algorithm": "local", "plan.world": 1, "workload.seq_len": 1024},
    {"plan.algorithm": "ulysses", "workload.seq_len": 512},
    {"plan.algorithm": "ring", "workload.seq_len": 512},
    {"plan.algorithm": "ring", "workload.seq_len": 1024},
    {"plan.algorithm": "ulysses", "workload.seq_len": 2048, "workload.iters": 12},
]


@pytest.fixture(scope="session")
def ui_store(tmp_path_factory) -> str:
    """A fresh SQLite store (its schema created now, so a server can open it at once)."""
    from seqpar.platform.tracking import Tracker

    uri = f"sqlite:///{tmp_path_factory.mktemp('ui') / 'mlflow.db'}"
    Tracker(uri)
    return uri


@pytest.fixture(scope="session")
def mlflow_server(chromium, ui_store) -> Iterator[tuple[str, subprocess.Popen]]:
    """One `mlflow server` (one worker) on the store, on a free port; it starts while the sweep
    runs (ui_sweep waits for it)."""
    port = free_port()
    exe = Path(sys.executable).with_name("mlflow")
    cmd = [str(exe) if exe.exists() else "mlflow", "server", "--backend-store-uri", ui_store,
           "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        yield f"http://127.0.0.1:{port}", proc
    finally:  # the server and its uvicorn worker: the process group this fixture started
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def _two_ranks_alive(timeout_s: float, running: threading.Thread) -> bool:
    """Wait (state API, no browser) until a seqpar gang of two ranks is ALIVE."""
    from seqpar.platform import cluster

    deadline = time.monotonic() + timeout_s
    while running.is_alive() and time.monotonic() < deadline:
        try:
            actors = cluster.seqpar_actors()
        except Exception:
            actors = []
        names = {getattr(a, "name", "") for a in actors if getattr(a, "state", "") == "ALIVE"}
        if any(n.endswith(":rank-1") for n in names):
            return True
        time.sleep(0.5)
    return False


@pytest.fixture(scope="session")
def ui_sweep(chromium, ray_runner, ui_store, mlflow_server) -> Iterator[UiSweep]:
    """The sweep, logged to the store; the dashboard's actors page captured while a trial runs."""
    from seqpar.platform import cluster, dashboard
    from seqpar.platform.tracking import Tracker
    from seqpar.sweeps import spec
    from seqpar.sweeps.runner import run_sweep

    sweep = dict(SWEEP)
    sweep["grid"] = {"point": POINTS}
    plan = spec.parse(sweep, "ui-test")
    tracker = Tracker(ui_store)
    result: dict[str, object] = {}

    def work() -> None:
        try:
            result["outcome"] = run_sweep(plan, tracker=tracker, runner=ray_runner, progress=False)
        except BaseException as err:  # re-raised in the test thread
            result["error"] = err

    t0 = time.monotonic()
    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    info = UiSweep(ui_store, "", "", [])
    address = dashboard.url()
    proxy = None
    if address is not None and _two_ranks_alive(300, thread):
        # the dashboard through a proxy that presents the token, as its login page would
        host, port = address.removeprefix("http://").split(":")
        handler = type("Proxy", (_TokenProxy,), {"target": (host, int(port)),
                                                 "token": dashboard.read_token()})
        proxy = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=proxy.serve_forever, daemon=True).start()
        info.dashboard_url = f"http://127.0.0.1:{proxy.server_address[1]}/#/actors"
        t1 = time.monotonic()
        alive = thread.is_alive()
        info.dashboard_dom = run_chromium(chromium, info.dashboard_url, budget_ms=15000)
        info.dashboard_seen_while_running = alive and "rank-1" in info.dashboard_dom
        info.timings["dashboard_page_s"] = time.monotonic() - t1
        if SCREENSHOTS:
            run_chromium(chromium, info.dashboard_url, budget_ms=15000,
                         screenshot=DOCS / "ray-dashboard-actors.png", window="1400,600")
    thread.join(timeout=600)
    if proxy is not None:
        proxy.shutdown()
    info.timings["sweep_s"] = time.monotonic() - t0
    if "error" in result:
        raise result["error"]  # type: ignore[misc]
    outcome = result["outcome"]
    info.sweep_id = outcome.sweep_id  # type: ignore[attr-defined]
    info.experiment_id = tracker.client.get_run(info.sweep_id).info.experiment_id
    info.trial_names = [r.name for r in tracker.trials(info.sweep_id)]
    yield info
    cluster.POOL.evict()  # no idle gang of this sweep outlives the UI tests


@pytest.fixture(scope="session")
def mlflow_ui(ui_sweep, mlflow_server) -> str:
    url, proc = mlflow_server
    t0 = time.monotonic()
    wait_http(url + "/health", MLFLOW_START_TIMEOUT_S, proc)
    ui_sweep.timings["mlflow_wait_after_sweep_s"] = time.monotonic() - t0
    return url
