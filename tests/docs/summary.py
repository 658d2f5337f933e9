"""The docs test's summary line: how many of the manual's commands ran, how many were skipped and
why, how many wait for make test-full. A plugin of the whole session (tests/conftest.py registers
it), so that under pytest-xdist the controller, which sees every report but collects nothing,
prints it; the workers send it their count of deselected (make test-full) cases."""

from __future__ import annotations

from collections import Counter

import pytest

_outcomes: Counter[str] = Counter()
_skipped: list[str] = []
FULL_KEY = "seqpar_docs_full"  # in a worker's workeroutput


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


def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workeroutput"):  # a pytest-xdist worker
        session.config.workeroutput[FULL_KEY] = _outcomes["full"]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """A pytest-xdist worker ended (on the controller): every worker deselected the same cases."""
    _outcomes["full"] = max(_outcomes["full"], getattr(node, "workeroutput", {}).get(FULL_KEY, 0))


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
