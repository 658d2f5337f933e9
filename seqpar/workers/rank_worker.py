"""The Ray actor that is one rank: a process group per trial, the trial itself, dashboard metrics. A
gang (platform.cluster) holds P of these. Every rank receives the trial unchanged (`case.Trial`)
and where to meet (`Rendezvous`: rank 0's address, the node map, the device); it joins a fresh
process group there (nccl on CUDA, gloo on CPU, with the trial's timeout), runs the case's mode
(`measure.measure`, the table `mode -> measure`; it builds the trial's mesh, with the node map and
the trial's emulated links, on every rank), publishes its numbers as `ray.util.metrics`, and
destroys its groups whatever happened, so the next trial starts clean.

The actor runs with two threads: the trial occupies one, the other still answers `heartbeat()`, so a
hung collective can be reported (which phase, since when) before the gang is killed.
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

from seqpar.case import Case, TrainCase, Trial
from seqpar.platform.connection import comm_env
from seqpar.platform.devices import cuda_index, process_group_kwargs
from seqpar.workers.measure import RankMeasurement, measure


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


class _Metrics:
    """The dashboard's view of a rank (Prometheus via Ray's metrics agent), tagged by gang,
    algorithm and rank."""

    TAGS = ("gang", "algorithm", "rank")

    def __init__(self) -> None:
        from ray.util import metrics

        self.step_ms = metrics.Gauge("seqpar_step_ms", "median step time of the last trial",
                                     tag_keys=self.TAGS)
        self.tokens_per_s = metrics.Gauge("seqpar_tokens_per_s", "tokens per second (whole "
                                          "sequence) of the last trial", tag_keys=self.TAGS)
        self.peak_mem = metrics.Gauge("seqpar_peak_mem_bytes", "peak memory of the last trial",
                                      tag_keys=self.TAGS)
        self.bytes_sent = metrics.Counter("seqpar_bytes_sent", "bytes this rank sent in timed "
                                          "iterations", tag_keys=self.TAGS)
        self.trials = metrics.Counter("seqpar_trials", "trials this rank ran", tag_keys=self.TAGS)

    def report(self, gang_id: str, case: Case | TrainCase, rank: int, m: RankMeasurement) -> None:
        tags = {"gang": gang_id, "algorithm": case.algorithm, "rank": str(rank)}
        step_ms = m.median_step_ms()
        self.step_ms.set(step_ms, tags=tags)
        self.tokens_per_s.set(case.batch * case.seq_len / (step_ms / 1e3), tags=tags)
        self.peak_mem.set(m.peak_mem_bytes, tags=tags)
        sent = sum(m.bytes_sent.values()) * case.iters
        if sent > 0:  # Ray's Counter.inc rejects 0, and local (P=1) sends nothing
            self.bytes_sent.inc(sent, tags=tags)
        self.trials.inc(1, tags=tags)


class RankWorker:
    """One rank of a gang. Created by platform.cluster.start_gang."""

    def __init__(self, rank: int, world: int, gang_id: str, threads: int = 1):
        self.rank, self.world, self.gang_id = rank, world, gang_id
        torch.set_num_threads(threads)  # a CPU share of one core must not spawn a thread per core
        self._phase, self._since = "idle", time.monotonic()
        self._metrics: _Metrics | None = None
        self._fault: str | None = None
        self._lock = threading.Lock()

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
                    "phase_s": time.monotonic() - self._since}

    def rendezvous_address(self) -> tuple[str, int]:
        """Rank 0's node IP and a free port for the next trial's process group."""
        import ray

        return ray.util.get_node_ip_address(), _free_port()

    # -- the trial --------------------------------------------------------------------------------
    def _set_phase(self, phase: str) -> None:
        with self._lock:
            self._phase, self._since = phase, time.monotonic()

    def run_trial(self, trial: Trial, meet: Rendezvous) -> RankMeasurement:
        cuda = meet.device == "cuda"
        if dist.is_initialized():  # a trial that died half-way must not poison this one
            dist.destroy_process_group()
        self._set_phase("rendezvous")
        t0 = time.perf_counter()
        index = self._cuda_index() if cuda else None
        if index is not None:
            torch.cuda.set_device(index)  # per thread: the trial's thread, before any CUDA work
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
            self._set_phase("measure")
            t1 = time.perf_counter()
            m = measure(trial.case, self.rank, dist.group.WORLD,
                        f"cuda:{index}" if index is not None else "cpu", nodes=meet.node_of_rank,
                        links=trial.link_models)
            m.extra.update(self.info())
            m.extra.update(init_pg_s=t1 - t0, measure_s=time.perf_counter() - t1)
            self._set_phase("report")
            self._report(trial, m)
            return m
        finally:
            dist.destroy_process_group()
            self._set_phase("idle")

    def _report(self, trial: Trial, m: RankMeasurement) -> None:
        """Publish to the dashboard; a metrics hiccup is noted, never a failed measurement."""
        try:
            if self._metrics is None:
                self._metrics = _Metrics()
            self._metrics.report(trial.gang_id, trial.case, self.rank, m)
        except Exception as err:  # the agent can be down or reject a value; the trial stands
            m.extra["metrics_error"] = f"{type(err).__name__}: {err}"

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
