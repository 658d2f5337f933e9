"""The Ray actor that is one rank: a process group per trial, the trial itself, dashboard metrics. A
gang (platform.cluster) holds P of these. For each trial every rank joins a fresh process group at
rank 0's address (nccl on CUDA, gloo on CPU, with the trial's timeout), sets the link emulation,
runs the case's mode (`measure.measure`, the table `mode -> measure`; it builds the trial's mesh,
with the trial's node map, on every rank), publishes its numbers as `ray.util.metrics`, and
destroys its groups and resets the process-wide settings whatever happened, so the next trial
starts clean.

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

from seqpar.algorithms.comm import LinkModel
from seqpar.case import Case, TrainCase
from seqpar.platform.connection import comm_env
from seqpar.platform.devices import cuda_index, process_group_kwargs
from seqpar.workers.measure import RankMeasurement, measure


@dataclass(frozen=True)
class RankTrial:
    """What every rank of the gang needs for one trial."""

    case: Case | TrainCase
    experiment_id: str
    master_addr: str
    master_port: int
    node_of_rank: tuple[int, ...]
    link_emulation: dict[str, LinkModel] | None
    device: str  # "cpu" | "cuda"
    timeout_s: float


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class _Metrics:
    """The dashboard's view of a rank (Prometheus via Ray's metrics agent), tagged by
    experiment, algorithm and rank."""

    TAGS = ("experiment", "algorithm", "rank")

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

    def report(self, experiment_id: str, case: Case, rank: int, m: RankMeasurement) -> None:
        tags = {"experiment": experiment_id, "algorithm": case.algorithm, "rank": str(rank)}
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

    def __init__(self, rank: int, world: int, experiment_id: str, threads: int = 1):
        import torch

        self.rank, self.world, self.experiment_id = rank, world, experiment_id
        torch.set_num_threads(threads)  # a CPU share of one core must not spawn a thread per core
        self._phase, self._since = "idle", time.monotonic()
        self._metrics: _Metrics | None = None
        self._fault: str | None = None
        self._lock = threading.Lock()

    # -- answered from the second thread, also while a trial runs ---------------------------------
    def info(self) -> dict[str, Any]:
        import ray
        import torch

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

    def run_trial(self, trial: RankTrial) -> RankMeasurement:
        import torch.distributed as dist

        cuda = trial.device == "cuda"
        if dist.is_initialized():  # a trial that died half-way must not poison this one
            dist.destroy_process_group()
        self._set_phase("rendezvous")
        t0 = time.perf_counter()
        index = self._cuda_index() if cuda else None
        if index is not None:
            import torch

            torch.cuda.set_device(index)  # per thread: the trial's thread, before any CUDA work
        dist.init_process_group(
            init_method=f"tcp://{trial.master_addr}:{trial.master_port}",
            rank=self.rank, world_size=self.world,
            # a safety net for a rank whose driver is gone; with the driver alive its deadline
            # (timeout_s) fires first, so a hang reads "timeout", not a gloo/NCCL error
            timeout=timedelta(seconds=2 * trial.timeout_s + 10),
            **process_group_kwargs(trial.device, index))
        try:
            dist.barrier()  # every rank joined (and on NCCL the communicator is up) before timing
            self._maybe_fault()
            self._set_phase("measure")
            t1 = time.perf_counter()
            m = measure(trial.case, self.rank, dist.group.WORLD,
                        f"cuda:{index}" if index is not None else "cpu", nodes=trial.node_of_rank,
                        links=trial.link_emulation)
            m.extra.update(self.info())
            m.extra.update(init_pg_s=t1 - t0, measure_s=time.perf_counter() - t1)
            self._set_phase("report")
            self._report(trial, m)
            return m
        finally:
            dist.destroy_process_group()
            self._set_phase("idle")

    def _report(self, trial: RankTrial, m: RankMeasurement) -> None:
        """Publish to the dashboard; a metrics hiccup is noted, never a failed measurement."""
        try:
            if self._metrics is None:
                self._metrics = _Metrics()
            self._metrics.report(trial.experiment_id, trial.case, self.rank, m)
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
