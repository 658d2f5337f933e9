"""How busy this rank's host was while the timed loop ran (`NoiseMeter`), read where the ranks run,
so a multi-node trial gets each host's own numbers (the driver cannot see other nodes' /proc).

    with NoiseMeter() as noise:          # or noise.start() ... noise.stop()
        ...timed passes...
    noise.sample   # {"wall_s", "cpu_s", "host_busy_s", "host_steal_s", "host_cores", ...}

What a rank records over the region (Linux; every reading that is missing elsewhere is left out):
- wall_s, cpu_s: the region's wall time and this process's CPU time (all its threads, gloo's too)
- run_delay_s: time this process was runnable but waited for a CPU (/proc/self/schedstat)
- host_busy_s, host_steal_s: CPU seconds the whole host spent busy (user, nice, system, irq,
  softirq) and that a hypervisor gave to other machines (steal), from /proc/stat's `cpu` line
- host_cores: the CPUs /proc/stat counts; cores: the CPUs this process may run on (its affinity)
- load_1m_before, load_1m_after: the 1-minute load average at both ends
- host: the host's name, so the driver can subtract the trial's own ranks from a host's busy time
The driver (`workers.stability.host_noise`) turns the ranks' samples into "others used X% of the
host" (the busy time no rank of the trial accounts for), steal and ranks per core.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

BUSY_FIELDS = (0, 1, 2, 5, 6)  # /proc/stat cpu: user nice system idle iowait irq softirq steal ...
STEAL_FIELD = 7


def _proc_stat() -> tuple[float, float, int] | None:
    """(busy seconds, steal seconds, cpus) of the whole host since boot; None off Linux."""
    try:
        with open("/proc/stat") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    fields = [int(x) for x in lines[0].split()[1:]]
    cpus = sum(1 for ln in lines[1:] if ln.startswith("cpu"))
    steal = fields[STEAL_FIELD] if len(fields) > STEAL_FIELD else 0
    return sum(fields[i] for i in BUSY_FIELDS) / ticks, steal / ticks, cpus


def _run_delay_s() -> float | None:
    """Seconds this process's threads waited on a run queue since they started (schedstat)."""
    try:
        with open("/proc/self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def _cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class NoiseMeter:
    """The host's noise over a region of one rank (see the module docstring)."""

    def __init__(self) -> None:
        self.sample: dict[str, Any] = {}

    def __enter__(self) -> NoiseMeter:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._load = os.getloadavg()[0]
        self._stat = _proc_stat()
        self._delay = _run_delay_s()
        self._cpu = _cpu_s()
        self._t0 = time.perf_counter()

    def stop(self) -> dict[str, Any]:
        """The sample of the region since start() (also kept as `.sample`)."""
        wall = time.perf_counter() - self._t0
        s: dict[str, Any] = {"wall_s": wall, "cpu_s": _cpu_s() - self._cpu, "cores": _cores(),
                             "load_1m_before": self._load, "load_1m_after": os.getloadavg()[0],
                             "host": socket.gethostname()}
        delay, stat = _run_delay_s(), _proc_stat()
        if delay is not None and self._delay is not None:
            s["run_delay_s"] = delay - self._delay
        if stat is not None and self._stat is not None:
            s["host_busy_s"] = stat[0] - self._stat[0]
            s["host_steal_s"] = stat[1] - self._stat[1]
            s["host_cores"] = stat[2]
        self.sample = s
        return s
