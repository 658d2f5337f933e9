"""Headless Chromium for the browser tests, and the servers they look at (helpers, no tests).

`Page` drives Chromium over its DevTools pipe (`--remote-debugging-pipe`, JSON messages ending in
NUL on fds 3 and 4): a test waits until the text it wants is on the page, so a page costs what it
takes to draw, not a fixed virtual-time budget that a loaded machine may not meet (MLflow's chart
view draws its charts lazily). `run_chromium` (--dump-dom / --screenshot) serves static pages and
the docs screenshots.
"""

from __future__ import annotations

import http.client
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--hide-scrollbars", "--no-first-run")


def browser() -> str | None:
    """The first Chromium-like binary on PATH, or None."""
    import shutil

    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


def run_chromium(binary: str, url: str, *, budget_ms: int = 20000, window: str = "1400,1000",
                 screenshot: Path | None = None, timeout_s: float = 180) -> str:
    """The DOM after the page settled (virtual time), or a screenshot when `screenshot` is set.
    Each call has a fresh profile: no local storage carries a view from one page to the next."""
    with tempfile.TemporaryDirectory(prefix="seqpar-chromium-") as profile:
        args = [binary, *FLAGS, f"--user-data-dir={profile}", f"--window-size={window}",
                f"--virtual-time-budget={budget_ms}"]
        args += [f"--screenshot={screenshot}"] if screenshot else ["--dump-dom"]
        out = subprocess.run(args + [url], capture_output=True, text=True, timeout=timeout_s)
    return out.stdout


def _above_9(fd: int) -> int:
    """A duplicate of fd numbered 10 or more (fd itself closed)."""
    import fcntl

    high = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return high


class Page:
    """One page in a fresh headless Chromium (its own profile), driven over the DevTools pipe.

    with Page(binary, url, window=(1400, 1000)) as page:
        text = page.wait_for(lambda t: "Runs" in t, timeout_s=120)
    """

    def __init__(self, binary: str, url: str, window: tuple[int, int] = (1400, 1000)):
        self._profile = tempfile.TemporaryDirectory(prefix="seqpar-chromium-")
        commands_r, self._commands = os.pipe()
        self._replies, replies_w = os.pipe()
        # the child's ends above fd 9, so that placing them on 3 and 4 cannot overwrite one another
        commands_r, replies_w = (_above_9(fd) for fd in (commands_r, replies_w))
        args = [binary, *FLAGS, f"--user-data-dir={self._profile.name}",
                f"--window-size={window[0]},{window[1]}", "--remote-debugging-pipe", "about:blank"]
        # Chromium reads commands on fd 3 and writes replies on fd 4: a small Python places the
        # pipe ends there and execs the browser (a distro's launcher script execs the real binary)
        place = (f"import os; os.dup2({commands_r}, 3); os.dup2({replies_w}, 4); "
                 f"os.execvp({args[0]!r}, {args!r})")
        self._proc = subprocess.Popen([sys.executable, "-c", place],
                                      pass_fds=(commands_r, replies_w),
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      start_new_session=True)
        os.close(commands_r)
        os.close(replies_w)
        self._buffer, self._id = b"", 0
        try:
            target = self._call("Target.createTarget", url="about:blank")["targetId"]
            self._session = self._call("Target.attachToTarget", targetId=target,
                                       flatten=True)["sessionId"]
            self._call("Emulation.setDeviceMetricsOverride", width=window[0], height=window[1],
                       deviceScaleFactor=1, mobile=False, session=True)
            self._call("Page.navigate", url=url, session=True)
        except BaseException:
            self.close()
            raise

    def _call(self, method: str, *, session: bool = False, timeout_s: float = 60,
              **params: object) -> dict:
        self._id += 1
        message: dict[str, object] = {"id": self._id, "method": method, "params": params}
        if session:
            message["sessionId"] = self._session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout_s
        while True:
            while b"\0" not in self._buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self._replies], [], [], left)[0]:
                    raise TimeoutError(f"chromium: no answer to {method} within {timeout_s:g} s")
                chunk = os.read(self._replies, 1 << 16)
                if not chunk:
                    raise RuntimeError(f"chromium exited during {method}")
                self._buffer += chunk
            raw, self._buffer = self._buffer.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._id:  # events and other replies are not waited for
                if "error" in reply:
                    raise RuntimeError(f"chromium {method}: {reply['error']}")
                return reply["result"]

    def evaluate(self, expression: str) -> object:
        result = self._call("Runtime.evaluate", expression=expression, returnByValue=True,
                            session=True)
        return result["result"].get("value")

    def text(self) -> str:
        """What the page shows (document.body.innerText)."""
        return self.evaluate("document.body ? document.body.innerText : ''") or ""

    def scroll_boxes(self) -> None:
        """Scroll every scrolled box of the page down by its height, as a reader would: long
        lists (MLflow's metrics) draw only the rows in view."""
        self.evaluate("""(() => { for (const e of document.querySelectorAll('*')) {
            if (e.scrollHeight > e.clientHeight + 4
                && /auto|scroll/.test(getComputedStyle(e).overflowY)) e.scrollTop += e.clientHeight;
        } })()""")

    def html(self) -> str:
        return self.evaluate("document.documentElement.outerHTML") or ""

    def reload(self) -> None:
        self._call("Page.reload", session=True)

    def wait_for(self, done: Callable[[str], bool], timeout_s: float, poll_s: float = 0.5,
                 reload_every_s: float | None = None,
                 stop: Callable[[], bool] = lambda: False) -> str:
        """Poll the page's text until done(text), the timeout, or stop(); returns the last text."""
        deadline = time.monotonic() + timeout_s
        reloaded = time.monotonic()
        while True:
            text = self.text()
            if done(text) or stop() or time.monotonic() > deadline:
                return text
            if reload_every_s is not None and time.monotonic() - reloaded > reload_every_s:
                self.reload()
                reloaded = time.monotonic()
            time.sleep(poll_s)

    def resize(self, width: int, height: int) -> None:
        self._call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                   deviceScaleFactor=1, mobile=False, session=True)

    def screenshot(self, path: Path) -> None:
        import base64

        data = self._call("Page.captureScreenshot", format="png", session=True)["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        try:
            self._call("Browser.close", timeout_s=10)
        except Exception:
            pass
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
        for fd in (self._commands, self._replies):
            try:
                os.close(fd)
            except OSError:
                pass
        self._profile.cleanup()

    def __enter__(self) -> Page:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
            time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer within {timeout_s:g} s")


def start_mlflow_server(uri: str) -> tuple[str, subprocess.Popen]:
    """`mlflow server` (one worker) on the store, on a free port, in its own process group; it
    answers /health some seconds later (wait_http). Without MLflow's job execution (its GenAI
    jobs, which no page here uses): its runner and half a dozen huey consumers each import MLflow,
    26 CPU s to start the server against 9."""
    port = free_port()
    exe = Path(sys.executable).with_name("mlflow")
    cmd = [str(exe) if exe.exists() else "mlflow", "server", "--backend-store-uri", uri,
           "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, env=env)
    return f"http://127.0.0.1:{port}", proc


def stop_process_group(proc: subprocess.Popen) -> None:
    """SIGTERM the process group `proc` leads (a server and its workers), SIGKILL after 5 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=5)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


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
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the browser moved on (a reload, or it closed)

    def log_message(self, *args: object) -> None:
        pass


def dashboard_proxy(address: str, token: str | None) -> ThreadingHTTPServer:
    """A local proxy (serving in a daemon thread) that presents `token` to the dashboard at
    `address` (http://host:port); shut it down when done."""
    host, port = address.removeprefix("http://").rstrip("/").split(":")
    handler = type("Proxy", (_TokenProxy,), {"target": (host, int(port)), "token": token})
    proxy = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    return proxy
