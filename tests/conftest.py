"""Shared fixtures: one gang of 8 local gloo ranks serves every multi-rank test (P = 1, 2, 3, 4, 8);
one embedded Ray serves the in-process Ray tests; the quickstart sweep runs once for tests/cli,
tests/ui and tests/docs. Every collective runs with NCCL's semantics (SEQPAR_STRICT_COMM=1) and
every test phase has a deadline (SEQPAR_TEST_TIMEOUT_S)."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests import budget, parallel, resources
from tests.docs import summary as docs_summary

os.environ.setdefault("OMP_NUM_THREADS", "1")
# NCCL's semantics for every collective the suite runs (algorithms/comm.py: tags ignored, a group's
# operations in order), so a schedule that would hang on GPUs fails here; 0 turns it off
os.environ.setdefault("SEQPAR_STRICT_COMM", "1")

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
QUICKSTART_TIMEOUT_S = 600.0
# every test phase (setup, call, teardown) has a deadline, so a hang fails its test, not the run:
# SEQPAR_TEST_TIMEOUT_S overrides both (0: none); a test on the shared gloo gang gets the short one
TEST_TIMEOUT_ENV_VAR = "SEQPAR_TEST_TIMEOUT_S"
DEFAULT_TEST_TIMEOUT_S, MULTIRANK_TEST_TIMEOUT_S = 660.0, 180.0
_hung: list[str] = []  # tests on the shared gang that hung: the gang is no use after them


def _limit_s(item: pytest.Item) -> float:
    if TEST_TIMEOUT_ENV_VAR in os.environ:
        return float(os.environ[TEST_TIMEOUT_ENV_VAR])
    return MULTIRANK_TEST_TIMEOUT_S if "gang" in item.fixturenames else DEFAULT_TEST_TIMEOUT_S


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """A SIGALRM per phase: past its limit the phase fails where it stands, with its stack."""
    if threading.current_thread() is not threading.main_thread():
        return (yield)
    limit = _limit_s(item)

    def expired(signum: int, frame) -> None:
        if "gang" in item.fixturenames:
            _hung.append(item.nodeid)
        stack = "".join(traceback.format_stack(frame)[-8:])
        pytest.fail(f"timed out after {limit:g} s ({TEST_TIMEOUT_ENV_VAR}); it was at:\n{stack}",
                    pytrace=False)

    previous = signal.signal(signal.SIGALRM, expired)
    try:
        return (yield)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _deadline(item: pytest.Item):
    limit = _limit_s(item)
    armed = limit > 0 and threading.current_thread() is threading.main_thread()
    if armed:
        signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        return (yield)
    finally:
        if armed:
            signal.setitimer(signal.ITIMER_REAL, 0)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    if _hung and "gang" in item.fixturenames:
        pytest.fail(f"not run: the shared gloo gang hung in {_hung[0]}", pytrace=False)
    return (yield from _deadline(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    return (yield from _deadline(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    try:
        return (yield from _deadline(item))
    finally:
        resources.close_after(item)


def pytest_configure(config: pytest.Config) -> None:
    budget.configure(config)  # SEQPAR_TEST_BUDGET=FILE: every test's CPU and wall seconds
    config.pluginmanager.register(docs_summary, "seqpar-docs-summary")
    parallel.configure(config)  # -n 2 --dist loadgroup: the suite's groups, one worker each


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    if not resources.FULL:  # `make test`: the slow scenarios are make test-full's
        slow = [i for i in items if i.get_closest_marker("slow")]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [i for i in items if not i.get_closest_marker("slow")]
    resources.order(items)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    resources.close_all()


@pytest.fixture(scope="module")  # a module-scoped fixture may use it
def gang():
    """The 8 local gloo ranks every multi-rank test shares (seqpar.platform.localgang)."""
    from seqpar.platform.localgang import LocalGang

    return resources.shared("gang", lambda: LocalGang(8, sizes=(1, 2, 3, 4), device="cpu"))


@pytest.fixture(scope="module")  # a module-scoped fixture may use it
def ray_runner():
    """One TrialRunner on an embedded local Ray (device cpu) shared by every Ray test: Ray start-up
    (~8 s here) is paid once, and gangs are reused across tests of the same experiment id."""
    from seqpar.workers.trial import TrialRunner

    return resources.shared("ray_runner", lambda: TrialRunner(device="cpu"))


@pytest.fixture
def sweeps_share_a_gang(monkeypatch) -> None:
    """The sweeps this test runs on `ray_runner` take their ranks from the shared gang id
    (resources.RAY_GANG) instead of one named by the sweep (seqpar:sweep-<id>:rank-<r>), so the
    idle gang an earlier test left is reused. The sweep prints and tags its own id as before; a
    test of those actor names (tests/platform/test_artifact_store.py) does not take this."""
    from seqpar.sweeps import runner

    run_until_stable = runner.run_until_stable

    def shared(point, trial_runner, retries, gang_id, *args, **kwargs):
        return run_until_stable(point, trial_runner, retries, resources.RAY_GANG, *args, **kwargs)

    monkeypatch.setattr(runner, "run_until_stable", shared)


@pytest.fixture(scope="session")
def empty_store_file(tmp_path_factory) -> Path:
    """An MLflow SQLite store with its schema and nothing else, made once: MLflow's schema
    migrations take seconds per new store (tests that create a store on purpose do not use it)."""
    from seqpar.platform.tracking import Tracker

    path = tmp_path_factory.mktemp("empty-store") / "mlflow.db"
    Tracker(f"sqlite:///{path}")
    return path


@pytest.fixture
def fresh_store(empty_store_file, tmp_path) -> str:
    """The URI of a new, empty MLflow SQLite store, tmp_path/mlflow.db (a copy of the session's)."""
    shutil.copyfile(empty_store_file, tmp_path / "mlflow.db")
    return f"sqlite:///{tmp_path}/mlflow.db"


@pytest.fixture
def seed() -> int:
    """A fresh seed per test, printed on failure so a red run can be replayed."""
    value = secrets.randbelow(2**31)
    print(f"seed={value}")
    return value


@pytest.fixture
def arm_fault(monkeypatch, ray_runner):
    """arm_fault(kind, rank=1, gangs=1): the next `gangs` gangs this process starts get a fault on
    `rank` in their first trial, after the process group is up: 'raise' (the trial raises a
    ValueError, as a bug would), 'die' (the rank's process exits, as on an OOM kill) or 'hang' (the
    rank worker's own `_arm_fault` hook). A retry's fresh gang is healthy once `gangs` are used up."""
    import ray

    from seqpar.platform import cluster

    armed: list[tuple[str, int]] = []
    start_gang = cluster.start_gang

    def patch(worker, kind: str) -> None:  # runs inside the rank actor (pickled by value)
        import os

        def fault() -> None:
            del worker._maybe_fault  # one shot: the class's hook again
            if kind == "die":
                os._exit(1)
            raise ValueError("injected: a deterministic bug in the trial")

        worker._maybe_fault = fault

    def started(*args, **kwargs):
        gang = start_gang(*args, **kwargs)
        if armed:
            kind, rank = armed.pop(0)
            actor = gang.actors[rank]
            ray.get(actor._arm_fault.remote("hang") if kind == "hang"
                    else actor.__ray_call__.remote(patch, kind))
        return gang

    def arm(kind: str, rank: int = 1, gangs: int = 1) -> None:
        assert kind in ("raise", "die", "hang")
        ray_runner.pool.evict()  # the next trial starts a gang, whatever is idle
        armed.extend([(kind, rank)] * gangs)

    monkeypatch.setattr(cluster, "start_gang", started)
    return arm


@dataclass
class Quickstart:
    """One `seqpar sweep examples/quickstart.yaml` and what was seen while it ran."""

    uri: str
    workdir: Path  # its working directory (a default ./mlflow.db would land here)
    returncode: int | None = None
    stdout: str = ""
    stderr: str = ""
    mlflow: tuple[str, subprocess.Popen] | None = None  # (url, process) of the MLflow server
    dashboard_url: str = ""
    dashboard_dom: str = ""
    dashboard_seen_while_running: bool = False
    dashboard_error: str = ""
    dashboard_text: str = ""  # what the actors page showed last
    dashboard_address: str = ""  # the dashboard the sweep announced
    timings: dict[str, float] = field(default_factory=dict)
    sweep_id: str = ""  # the quickstart's sweep run (other sweeps may land in the store later)


def _browser_tests_selected(session: pytest.Session) -> bool:
    return any(item.nodeid.startswith("tests/ui/test_browser.py") for item in session.items)


def _capture_dashboard(run: Quickstart, binary: str, address: str, proc: subprocess.Popen,
                       started: float) -> None:
    """The Ray dashboard's actors page (through a proxy that presents the token, as its login page
    would), looked at until a rank-1 actor is on it, while the sweep still runs."""
    from seqpar.platform import dashboard
    from tests.ui import browser as web

    t0 = time.monotonic()
    run.dashboard_address = address
    proxy = web.dashboard_proxy(address, dashboard.read_token())
    try:
        run.dashboard_url = f"http://127.0.0.1:{proxy.server_address[1]}/#/actors"
        run.timings["dashboard_opened_after_s"] = time.monotonic() - started
        with web.Page(binary, run.dashboard_url, window=(1400, 600)) as page:
            text = page.wait_for(lambda t: "rank-1" in t, timeout_s=QUICKSTART_TIMEOUT_S,
                                 poll_s=1, reload_every_s=4, stop=lambda: proc.poll() is not None)
            running = proc.poll() is None
            run.dashboard_dom = page.html()
            if os.environ.get("SEQPAR_SCREENSHOTS") == "1":  # for docs/ (tests/ui/conftest.py)
                page.screenshot(ROOT / "docs" / "ray-dashboard-actors.png")
        run.dashboard_seen_while_running = running and "rank-1" in text
        run.dashboard_text = text
    finally:
        proxy.shutdown()
    run.timings["dashboard_s"] = time.monotonic() - t0


@pytest.fixture(scope="session")
def quickstart(request, tmp_path_factory, empty_store_file) -> Quickstart:
    """examples/quickstart.yaml run once as a user runs it: `seqpar sweep` in a subprocess with its
    own embedded Ray, into a temporary SQLite store (its schema copied in). tests/cli checks the
    store and `seqpar compare` on it, tests/ui shows it in the browser, tests/docs runs the
    manual's `compare` and `report` lines on it. When browser tests are selected (and Chromium is
    found), the MLflow server starts on the store once Ray is up, and the Ray dashboard's actors
    page is captured while the sweep runs."""
    from tests.ui import browser as web

    workdir = tmp_path_factory.mktemp("quickstart")
    (workdir / "store").mkdir()
    # the store's schema made once (creating a store as a user's first sweep does: tests/ui)
    shutil.copyfile(empty_store_file, workdir / "store" / "mlflow.db")
    run = Quickstart(f"sqlite:///{workdir}/store/mlflow.db", workdir)
    binary = web.browser() if _browser_tests_selected(request.session) else None
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS")}
    env["PYTHONUNBUFFERED"] = "1"  # each line as it is printed (a pipe is block-buffered)
    seqpar = str(Path(sys.executable).parent / "seqpar")
    t0 = time.monotonic()
    proc = subprocess.Popen([seqpar, "--tracking-uri", run.uri, "sweep", str(QUICKSTART)],
                            cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    out: list[str] = []
    err: list[str] = []
    address: list[str] = []
    announced, first_trial = threading.Event(), threading.Event()

    def read_stdout() -> None:
        for line in proc.stdout:
            out.append(line)
            found = re.search(r"Ray dashboard: (http://\S+?)/#/actors", line)
            if found:
                address.append(found.group(1))
            if found or "Ray dashboard: not running" in line:
                announced.set()
        announced.set()

    def read_stderr() -> None:  # the progress: one line per trial as it ends
        for line in proc.stderr:
            err.append(line)
            if line.startswith(("✓ ", "✗ ")):  # a trial ended: the next (on 4 ranks) starts
                first_trial.set()
        first_trial.set()

    readers = [threading.Thread(target=read_stdout, daemon=True),
               threading.Thread(target=read_stderr, daemon=True)]
    for t in readers:
        t.start()
    try:
        if binary is not None:
            announced.wait(QUICKSTART_TIMEOUT_S)  # Ray is up: the store exists by now
            run.mlflow = web.start_mlflow_server(run.uri)
            request.addfinalizer(lambda: web.stop_process_group(run.mlflow[1]))
            if address:
                first_trial.wait(QUICKSTART_TIMEOUT_S)  # the local (one-rank) trials come first
                try:
                    _capture_dashboard(run, binary, address[0], proc, t0)
                except Exception as problem:  # the browser's: tests/ui reports it
                    run.dashboard_error = f"{type(problem).__name__}: {problem}"
        run.returncode = proc.wait(timeout=max(1.0, QUICKSTART_TIMEOUT_S - (time.monotonic() - t0)))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for t in readers:
        t.join(timeout=10)
    run.stdout, run.stderr = "".join(out), "".join(err)
    run.timings["sweep_s"] = time.monotonic() - t0
    if run.returncode == 0:
        from seqpar.platform.tracking import Tracker

        latest = Tracker(run.uri, existing=True).latest_sweep()
        run.sweep_id = latest.run_id if latest is not None else ""
    return run
