"""`make test` on two pytest-xdist workers (`pytest -n 2`; docs/development.md, "The budget"): the
tests of one session resource (`resources.group`: the gang; the embedded Ray; the quickstart sweep;
a module's own Ray head) go to one worker together, which makes the resource once and closes it
after its last test there; every other test goes, one at a time, to whichever worker is free. The
groups go out in the suite's order (`resources.order`): the gang's to the first worker, the Ray
group to the second, then the quickstart's and the rest.

xdist's own loadgroup tells the controller a test's group by appending "@name" to its node id,
which pytest 9's node ids no longer allow (it would run every test alone). So each worker writes
the groups it collected to a folder of the controller's, and the controller's scheduler
(`scheduling`) reads them once every worker has collected. A worker also sends the tests it
deselected, so that the final line says "N deselected" as a run without workers does."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests import resources

# A worker's niceness once it runs a test outside the Ray group: the embedded Ray's tests wait on
# heartbeats, timeouts and emulated links, and time steps against each other (a ring on 2 x 2
# against 1 x 4), so their ranks get the CPU when they ask for it; the gang's and the other tests
# take what is left (the same CPU seconds in all)
NICE = 10
GROUPS_KEY = "seqpar_groups_dir"  # the controller's folder, in each worker's workerinput
TERMINAL_KEY = "seqpar_terminal"  # the controller's COLUMNS and LINES, in each worker's workerinput
DESELECTED_KEY = "seqpar_deselected"  # a worker's deselected node ids, in its workeroutput


def configure(config: pytest.Config) -> None:
    """Under `-n N` (xdist's `--dist load`, or `--dist loadgroup`; tests/conftest.py calls it): the
    controller's plugin on the controller, the worker's on each worker. Other `--dist` modes are
    xdist's own (a resource is then made on every worker that runs one of its tests)."""
    if GROUPS_KEY in getattr(config, "workerinput", {}):
        config.pluginmanager.register(Worker(config.workerinput), "seqpar-parallel")
    elif config.pluginmanager.hasplugin("xdist") \
            and config.getoption("dist", "no") in ("load", "loadgroup"):
        config.pluginmanager.register(Controller(), "seqpar-parallel")


class Worker:
    """A worker's side: the groups it collected, to the controller's folder; its niceness (NICE)
    from its first test outside the Ray group; what it deselected, to the controller at the end."""

    def __init__(self, workerinput: dict) -> None:
        self.path = Path(workerinput[GROUPS_KEY]) / f"{workerinput['workerid']}.json"
        self.deselected: list[str] = []
        self.niced = False
        # a worker's readline sets COLUMNS=80 and LINES=24 (no terminal): the CLI's tables would
        # wrap at 80 columns where the controller's (160 without COLUMNS) do not
        for name, value in workerinput[TERMINAL_KEY].items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    @pytest.hookimpl(trylast=True)  # the items as they will run (tests/conftest.py ordered them)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        groups = {i.nodeid: g for i in items if (g := resources.group(i)) is not None}
        self.path.with_suffix(".tmp").write_text(json.dumps(groups))
        os.replace(self.path.with_suffix(".tmp"), self.path)  # whole or absent to its reader

    @pytest.hookimpl(tryfirst=True)  # before its fixtures: the ranks and servers they start inherit it
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        if not self.niced and resources.group(item) != "ray":
            os.nice(NICE)
            self.niced = True

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        self.deselected.extend(i.nodeid for i in items)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        session.config.workeroutput[DESELECTED_KEY] = self.deselected


class Controller:
    """The controller's side: where the workers write their groups, the scheduler that reads
    them (`scheduling`), and the deselected tests in the final line."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="seqpar-groups-"))

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        node.workerinput[GROUPS_KEY] = str(self.folder)
        node.workerinput[TERMINAL_KEY] = {k: os.environ.get(k) for k in ("COLUMNS", "LINES")}

    @pytest.hookimpl(optionalhook=True, tryfirst=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log):
        return scheduling(config, log, self.folder)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        deselected = getattr(node, "workeroutput", {}).get(DESELECTED_KEY, [])
        reporter = node.config.pluginmanager.get_plugin("terminalreporter")
        if deselected and reporter is not None and "deselected" not in reporter.stats:
            reporter.stats["deselected"] = list(deselected)  # every worker deselected the same

    def pytest_unconfigure(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def scheduling(config: pytest.Config, log, folder: Path):
    """xdist's scheduling by scope (loadscope), a test's scope being its group (read from the
    workers' files) or, for a test of no group, the test itself; the units in the suite's order."""
    from xdist.scheduler import LoadScopeScheduling  # here: the suite runs without xdist too

    class GroupScheduling(LoadScopeScheduling):
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:  # every worker has collected (and written) by now
                files = sorted(folder.glob("*.json"))
                self.groups = json.loads(files[0].read_text()) if files else {}
            return self.groups.get(nodeid, nodeid)

    config.option.loadscopereorder = False  # xdist's default sorts the units by size
    return GroupScheduling(config, log)
