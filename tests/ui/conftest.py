"""Browser tests: headless Chromium against the real MLflow UI, the HTML report and the Ray dashboard.

They look at the session's quickstart sweep (the `quickstart` fixture, tests/conftest.py: run once,
as a user runs it, also checked by tests/cli/test_quickstart_end_to_end.py); its Ray dashboard's
actors page was captured while it ran, and one `mlflow server` on its store serves every MLflow
page. Without a `chromium` binary every browser test skips and says so (`apt-get install chromium`;
`.ci/run` installs it).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.ui import browser as web

DOCS = Path(__file__).resolve().parents[2] / "docs"
# screenshots for docs/ (each costs a second page load): SEQPAR_SCREENSHOTS=1 pytest tests/ui
SCREENSHOTS = os.environ.get("SEQPAR_SCREENSHOTS") == "1"
MLFLOW_START_TIMEOUT_S = 240.0  # one worker; a loaded 2-core machine imports MLflow slowly
PAGE_TIMEOUT_S = 240.0  # the longest a page may take to show what a test looks for


@pytest.fixture(scope="session")
def chromium() -> str:
    path = web.browser()
    if path is None:
        pytest.skip("headless Chromium not found (apt-get install chromium): browser tests skipped")
    return path


@dataclass
class UiSweep:
    uri: str
    sweep_id: str
    experiment_id: str
    trial_names: list[str]
    dashboard_dom: str = ""
    dashboard_seen_while_running: bool = False
    dashboard_url: str = ""
    dashboard_error: str = ""
    dashboard_text: str = ""
    dashboard_address: str = ""
    timings: dict[str, float] = field(default_factory=dict)


@pytest.fixture(scope="session")
def ui_sweep(chromium, quickstart) -> Iterator[UiSweep]:
    """The quickstart sweep as the browser tests see it: its ids, trial names and the dashboard."""
    from seqpar.platform.tracking import Tracker

    assert quickstart.returncode == 0, quickstart.stdout[-3000:] + quickstart.stderr[-3000:]
    tracker = Tracker(quickstart.uri)
    sweep = tracker.client.get_run(quickstart.sweep_id).info
    yield UiSweep(quickstart.uri, sweep.run_id, sweep.experiment_id,
                  [r.name for r in tracker.trials(sweep.run_id)],
                  quickstart.dashboard_dom, quickstart.dashboard_seen_while_running,
                  quickstart.dashboard_url, quickstart.dashboard_error, quickstart.dashboard_text,
                  quickstart.dashboard_address, quickstart.timings)


@pytest.fixture(scope="session")
def mlflow_ui(ui_sweep, quickstart) -> str:
    """The MLflow server the quickstart fixture started on the store, once it answers."""
    assert quickstart.mlflow is not None, "the quickstart fixture started no MLflow server"
    url, proc = quickstart.mlflow
    t0 = time.monotonic()
    web.wait_http(url + "/health", MLFLOW_START_TIMEOUT_S, proc)
    ui_sweep.timings["mlflow_wait_after_sweep_s"] = time.monotonic() - t0
    return url
