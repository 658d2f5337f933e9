"""The Ray actor that is one rank: a process group per trial, the trial itself, dashboard metrics. A
gang (platform.cluster) holds P of these. Every rank receives the trial unchanged (`case.Trial`)
and where to meet (`Rendezvous`: rank 0's address, the node map, the device); it joins a fresh
process group there (nccl on CUDA, with the watchdog settings of `devices.NCCL_WATCHDOG_ENV`; gloo
on CPU; with the trial's timeout), runs the case's mode (`measure.measure`, the table
`mode -> measure`; it builds the trial's mesh, with the node map and the trial's emulated links, on
every rank), and destroys its groups whatever happened, so the next trial starts clean.

The dashboard (platform.metrics): `repr(actor)` names the sweep and the rank (`RankWorker(sweep=
quickstart 1a2b3c4d, rank=1/2)`: the Actors view and every log line's prefix), and while a trial
runs the rank publishes its phase and the iterations done (`seqpar_rank_phase`,
`seqpar_trial_iterations`), then its results, every series tagged with the trial.

The actor runs with two threads: the trial occupies one, the other still answers `heartbeat()`, so a
hung collective can be reported (which phase, since when, which collective: `algorithms.observe`)
before the gang is killed.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from seqpar.algorithms.observe import observed
from seqpar.case import Trial
from seqpar.platform import metrics
from seqpar.platform.connection import comm_env
from seqpar.platform.devices import NCCL_WATCHDOG_ENV, cuda_index, process_group_kwargs
from seqpar.workers.measure import RankMeasurement, measure
from seqpar.workers.measure.timing import counting

RESULTS = ("seqpar_step_ms", "seqpar_tokens_per_s", "seqpar_peak_mem_bytes")


@dataclass(frozen=True)
class Rendezvous:
    """Where the gang's ranks meet for one trial (the run's, not the trial's)."""

    master_addr: str
    master_port: int
    node_of_rank: tuple[int, ...]  # the topology: virtual nodes on one machine, or real ones
    device: str                    # "cpu" | "cuda"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class RankWorker:
    """One rank of a gang. Created by platform.cluster.start_gang."""

    def __init__(self, rank: int, world: int, gang_id: str, threads: int = 1, sweep: str = ""):
        self.rank, self.world, self.gang_id, self.sweep = rank, world, gang_id, sweep
        torch.set_num_threads(threads)  # a CPU share of one core must not spawn a thread per core
        self._phase, self._since = "idle", time.monotonic()
        self._trial = metrics.NO_TRIAL  # the trial tag of the trial running (platform.metrics)
        self._iterations = 0            # its passes done, warm-up included
        self._waiting: str | None = None  # the collective it waits in (algorithms.observe)
        self._metrics = metrics.Publisher()
        self._fault: str | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        """What the dashboard's Actors view and every log prefix show (read once, at creation)."""
        sweep = " ".join(w for w in (self.sweep, metrics.sweep_tag(self.gang_id)) if w)
        return f"RankWorker(sweep={sweep}, rank={self.rank}/{self.world})"

    # -- answered from the second thread, also while a trial runs ---------------------------------
    def info(self) -> dict[str, Any]:
        import ray

        cuda = torch.cuda.is_available() and bool(ray.get_gpu_ids())
        return {"rank": self.rank, "node_id": ray.get_runtime_context().get_node_id(),
                "ip": ray.util.get_node_ip_address(), "pid": os.getpid(),
                "device_name": torch.cuda.get_device_name(self._cuda_index()) if cuda else "cpu",
                # the communication variables this rank runs with (in its per-rank record)
                "comm_env": comm_env()}

    def _cuda_index(self) -> int:
        """This actor's GPU as a torch index (see platform.devices.cuda_index)."""
        import ray

        return cuda_index(ray.get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES"))

    def heartbeat(self) -> dict[str, Any]:
        with self._lock:
            return {"rank": self.rank, "pid": os.getpid(), "phase": self._phase,
                    "phase_s": time.monotonic() - self._since, "trial": self._trial,
                    "iterations": self._iterations, "waiting": self._waiting}

    def rendezvous_address(self) -> tuple[str, int]:
        """Rank 0's node IP and a free port for the next trial's process group."""
        import ray

        return ray.util.get_node_ip_address(), _free_port()

    # -- the trial --------------------------------------------------------------------------------
    def _tags(self, **more: str) -> dict[str, str]:
        return {"sweep": metrics.sweep_tag(self.gang_id), "trial": self._trial,
                "rank": str(self.rank), **more}

    def _set_phase(self, phase: str) -> None:
        with self._lock:
            self._phase, self._since = phase, time.monotonic()
        for p in metrics.PHASES:  # one series per phase: 1 for this one (none for a test hook's)
            self._metrics.set("seqpar_rank_phase", float(p == phase), self._tags(phase=p))

    def _tick(self) -> None:
        self._iterations += 1

    def _note_waiting(self, what: str | None) -> None:
        self._waiting = what

    def _begin(self, tag: str) -> None:
        """A trial starts: its series replace the idle rank's."""
        self._metrics.set("seqpar_rank_phase", 0.0, self._tags(phase="idle"),
                          keep_s=metrics.ENDED_KEEP_S)
        with self._lock:
            self._trial, self._iterations = metrics.ascii_tag(tag) or metrics.NO_TRIAL, 0
        self._metrics.error = None
        self._metrics.follow("seqpar_trial_iterations", self._tags(), lambda: self._iterations)

    def _end(self) -> None:
        """The trial is over: its phases zeroed (kept a while, then dropped), the rank idle."""
        for p in metrics.PHASES:
            self._metrics.set("seqpar_rank_phase", 0.0, self._tags(phase=p),
                              keep_s=metrics.ENDED_KEEP_S)
        self._metrics.unfollow("seqpar_trial_iterations", self._tags())
        with self._lock:
            self._trial, self._waiting = metrics.NO_TRIAL, None
        self._set_phase("idle")

    def run_trial(self, trial: Trial, meet: Rendezvous, tag: str = "") -> RankMeasurement:
        """The trial on this rank; `tag`: its name in the dashboard (platform.metrics.trial_tag)."""
        self._begin(tag or trial.case.label())
        try:
            return self._run(trial, meet)
        finally:
            self._end()

    def _run(self, trial: Trial, meet: Rendezvous) -> RankMeasurement:
        cuda = meet.device == "cuda"
        if dist.is_initialized():  # a trial that died half-way must not poison this one
            dist.destroy_process_group()
        self._set_phase("rendezvous")
        t0 = time.perf_counter()
        index = self._cuda_index() if cuda else None
        if index is not None:
            torch.cuda.set_device(index)  # per thread: the trial's thread, before any CUDA work
            for key, value in NCCL_WATCHDOG_ENV.items():  # read when the process group is made
                os.environ.setdefault(key, value)
        dist.init_process_group(
            init_method=f"tcp://{meet.master_addr}:{meet.master_port}",
            rank=self.rank, world_size=self.world,
            # a safety net for a rank whose driver is gone; with the driver alive its deadline
            # (timeout_s) fires first, so a hang reads "timeout", not a gloo/NCCL error
            timeout=timedelta(seconds=2 * trial.timeout_s + 10),
            **process_group_kwargs(meet.device, index))
        try:
            dist.barrier()  # every rank joined (and on NCCL the communicator is up) before timing
            self._maybe_fault()
            training = trial.case.mode == "train"
            self._set_phase("train" if training else "measure")
            t1 = time.perf_counter()
            after = (lambda: self._set_phase("memory")) if training else None
            with observed(self._note_waiting), counting(self._tick, after):
                m = measure(trial.case, self.rank, dist.group.WORLD,
                            f"cuda:{index}" if index is not None else "cpu",
                            nodes=meet.node_of_rank, links=trial.link_models)
            m.extra.update(self.info())
            m.extra.update(init_pg_s=t1 - t0, measure_s=time.perf_counter() - t1)
            self._set_phase("report")
            self._report(trial, m)
            return m
        finally:
            dist.destroy_process_group()

    def _report(self, trial: Trial, m: RankMeasurement) -> None:
        """The trial's results on the dashboard (the last trial's gauges replace the one before);
        a metrics hiccup is noted, never a failed measurement."""
        case = trial.case
        tags = self._tags(gang=trial.gang_id, algorithm=case.algorithm)
        step_ms = m.median_step_ms()
        values = {"seqpar_step_ms": step_ms,
                  "seqpar_tokens_per_s": case.batch * case.seq_len / (step_ms / 1e3),
                  "seqpar_peak_mem_bytes": m.peak_mem_bytes}
        for name in RESULTS:
            self._metrics.drop(name, rank=str(self.rank))
            self._metrics.set(name, values[name], tags)
        self._metrics.inc("seqpar_bytes_sent", sum(m.bytes_sent.values()) * case.iters, tags)
        self._metrics.inc("seqpar_trials", 1, tags)
        if self._metrics.error is not None:  # the agent can be down or reject a value
            m.extra["metrics_error"] = self._metrics.error

    def _arm_fault(self, kind: str) -> None:
        """Test hook (not for users): 'hang' makes this rank's next trial block forever after it
        joined the process group, as a rank stuck in a collective would; its peers then wait in
        their first collective."""
        self._fault = kind

    def _maybe_fault(self) -> None:
        fault, self._fault = self._fault, None
        if fault == "hang":
            self._set_phase("hang (injected)")
            threading.Event().wait()
