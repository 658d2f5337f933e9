"""A watchdog that stops an embedded Ray's processes when the process that started it dies, even by
SIGKILL.

Ray ties the head processes it starts (GCS, raylet, dashboard, monitors) to the driver with
PR_SET_PDEATHSIG, so they die with it; but the raylet's own children, the DashboardAgent and the
RuntimeEnvAgent, then see their raylet gone and try to report its death to the GCS, which is gone
too, and hang there for good, re-parented to init (Ray 2.60, `_private/process_watcher.py`).

    guard = reaper.watch(head_pids)   # right after ray.init: the processes it started
    ...
    guard.close()                     # after ray.shutdown: the watchdog sweeps up and exits

The watchdog is a separate process in its own session (a terminal's Ctrl-C does not reach it). It
holds the read end of a pipe whose only write end is the driver's: end-of-file means the driver has
exited, however it died. Meanwhile it keeps a list of the head processes and their descendants (with
their start times, so a recycled pid is never taken for one of them) and, at end-of-file, terminates
whatever on that list still runs (SIGTERM, then SIGKILL after a grace). It touches no other process.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys

POLL_S = 1.0   # how often the watchdog refreshes its list (a scan costs ~12 ms here)
GRACE_S = 3.0  # between SIGTERM and SIGKILL


class Guard:
    """The driver's end of the pipe; closing it (or the driver dying) releases the watchdog."""

    def __init__(self, fd: int, process: subprocess.Popen):
        self._fd: int | None = fd
        self.process = process

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self.process.poll()  # reap it once it is done: no zombie in a long-lived process


def watch(pids: list[int]) -> Guard:
    """Start a watchdog over the processes `pids` and their descendants (see the module docstring)."""
    read_fd, write_fd = os.pipe()  # both close-on-exec: Ray's future children do not inherit them
    try:
        process = subprocess.Popen(
            # the file, not `-m seqpar...`: it needs only the standard library and psutil
            [sys.executable, os.path.abspath(__file__), str(read_fd), *map(str, pids)],
            pass_fds=(read_fd,), start_new_session=True, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True)
    finally:
        os.close(read_fd)
    return Guard(write_fd, process)


def _tree(roots: list, known: dict) -> None:
    import psutil

    for root in roots:
        try:
            if root.is_running():
                known.setdefault((root.pid, root.create_time()), root)
                for child in root.children(recursive=True):
                    known.setdefault((child.pid, child.create_time()), child)
        except psutil.Error:  # gone between the two calls
            pass


def _main(read_fd: int, pids: list[int]) -> None:
    import psutil

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    roots = []
    for pid in pids:
        try:
            roots.append(psutil.Process(pid))
        except psutil.Error:
            pass
    known: dict = {}
    while True:
        _tree(roots, known)
        ready, _, _ = select.select([read_fd], [], [], POLL_S)
        if ready and not os.read(read_fd, 4096):
            break  # end-of-file: the driver is gone (or disconnected)
    alive = [p for p in known.values() if p.is_running() and p.pid != os.getpid()]
    for p in alive:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, stubborn = psutil.wait_procs(alive, timeout=GRACE_S)
    for p in stubborn:
        try:
            p.kill()
        except psutil.Error:
            pass


if __name__ == "__main__":
    _main(int(sys.argv[1]), [int(a) for a in sys.argv[2:]])
