"""Run trials on Ray: one `case.Trial` on one gang of rank actors.

    with TrialRunner() as runner:                      # embedded local Ray, cpu + gloo here
        trial = Trial(Case("ring", world=4), gang_id="mine", nodes=2,
                      links={"inter": LinkModel(1e-3, 1e9)})
        result = runner.run(trial)
        print(result.status, result.metrics["step_ms"])

Bad input is a ConfigError when the Trial is made, before any actor starts; anything that goes
wrong after that ends the trial FAILED with its cause and its kind (`result.failure`: a rank raised,
a rank died, a timeout, or start-up), kills the gang and leaves nothing behind; the next trial gets
a fresh gang. While the trial runs each rank's heartbeat is asked on its own (`heartbeats`): a rank
that stops answering (a stopped process, a lost node) ends the trial before its timeout, named with
its node, its phase and the collective its peers wait in (kind timeout). A healthy gang is kept
for the next trial of the same gang id, world size, device kind and variables (start-up is the
expensive part). Every rank gets the trial as it is; the ranks'
records come back and the metrics are computed once, here (`TrialResult.finish`).
Ctrl-C tears the gang down before the KeyboardInterrupt propagates.

In the Ray dashboard a trial's remote calls carry its name (`run(trial, tag=...)`: its short label
and spec hash, platform.metrics.trial_tag) and the rank actors name their sweep (`sweep=`).
"""

from __future__ import annotations

import time
from typing import Any

from seqpar.case import Trial
from seqpar.errors import require
from seqpar.platform import cluster, connection, metrics, topology
from seqpar.workers.heartbeats import (
    DEFAULT_SILENT_S,
    NOTED_SILENT_S,
    SILENT_ENV_VAR,
    WATCH_S,
    Heartbeats,
    node_text,
)
from seqpar.workers.rank_worker import RankWorker, Rendezvous
from seqpar.workers.result import FailureKind, TrialResult

__all__ = ["FailureKind", "TrialResult", "TrialRunner"]

FAILURE_GRACE_S = 2.0  # after one rank fails, how long the others get to report theirs


def _error_text(err: BaseException) -> str:
    """One line for a rank's failure: the user's exception, or how the actor died."""
    import ray.exceptions as rex

    if isinstance(err, rex.RayTaskError):
        cause = err.cause if err.cause is not None else err
        return f"raised {type(cause).__name__}: {str(cause).strip().splitlines()[-1][:300]}"
    if isinstance(err, rex.RayActorError):
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
        return "died: " + " ".join(lines[:2])[:300]
    return f"{type(err).__name__}: {err}"[:300]


def _cause(err: BaseException) -> BaseException:
    import ray.exceptions as rex

    return err.cause if isinstance(err, rex.RayTaskError) and err.cause is not None else err


def _is_echo(err: BaseException) -> bool:
    """A rank's communication error: a peer failed under it (a gloo read on a closed pair, a broken
    NCCL communicator, torch.distributed's DistError), not the rank's own fault."""
    cause = _cause(err)
    if "DistError" in {t.__name__ for t in type(cause).__mro__}:
        return True
    text = str(cause).lower()
    return isinstance(cause, RuntimeError) and ("gloo" in text or "nccl" in text)


def failure_kind(err: BaseException) -> FailureKind:
    """A rank's failure, typed: its process went away (RayActorError), or its code raised. A raise
    from torch.distributed's layers is not the trial's code: a store or network error is the
    rendezvous failing (start-up), any other communication error a collective broken by a peer.
    An import that fails is the rank's node lacking a package (start-up)."""
    import ray.exceptions as rex

    if isinstance(err, rex.RayActorError):
        return FailureKind.RANK_DIED
    names = {t.__name__ for t in type(_cause(err)).__mro__}
    if names & {"DistNetworkError", "DistStoreError", "ImportError"}:
        return FailureKind.STARTUP
    return FailureKind.RANK_DIED if _is_echo(err) else FailureKind.RANK_RAISED


def first_failure(errors: dict[int, BaseException]) -> int:
    """The rank whose failure is the trial's cause: a death first, then a rank's own exception,
    then a communication error (the echo on its peers of one of the former)."""
    import ray.exceptions as rex

    died = [r for r, e in errors.items() if isinstance(e, rex.RayActorError)]
    raised = [r for r, e in errors.items() if r not in died and not _is_echo(e)]
    return min(died or raised or errors)


class TrialRunner:
    """Runs trials on a Ray cluster; see the module docstring."""

    def __init__(self, address: str | None = None, device: str | None = None, *,
                 job_metadata: dict[str, str] | None = None):
        """`job_metadata`: the Ray job's (`JobConfig(metadata=)`; `ray list jobs --detail`)."""
        self.connection = connection.connect(address, metadata=job_metadata)
        self.device = connection.detect_device(device)
        self.pool = cluster.GangPool()  # the gangs this runner keeps (one idle at most)

    # -- gangs ------------------------------------------------------------------------------------
    def _acquire(self, trial: Trial, sweep: str) -> tuple[cluster.Gang, bool]:
        multi_node = len(connection.alive_nodes()) > 1  # asked each time: clusters grow and shrink
        rpn = trial.ranks_per_node
        assert rpn is not None  # resolved when the trial was made
        key = cluster.GangKey(trial.gang_id, trial.world, self.device,
                              rpn if multi_node else None, trial.env_vars)
        gang = self.pool.take(key)  # kills an idle gang of another shape: frees its resources
        if gang is not None and self._healthy(gang):
            return gang, True
        if gang is not None:
            gang.kill()
        env = self.connection.rank_env_vars(trial.env)
        return cluster.start_gang(RankWorker, key, rpn, env_vars=env,
                                  init_kwargs={"sweep": sweep} if sweep else None), False

    @staticmethod
    def _healthy(gang: cluster.Gang) -> bool:
        import ray

        try:
            ray.get([a.heartbeat.remote() for a in gang.actors], timeout=10)
        except Exception:  # a rank died between trials (node loss, OOM kill): start afresh
            return False
        return True

    # -- trials -----------------------------------------------------------------------------------
    def run(self, trial: Trial, *, tag: str = "", sweep: str = "") -> TrialResult:
        """One trial; never raises for a failing trial (status FAILED, cause set). `tag`: its name
        in the dashboard (default its case's label); `sweep`: the sweep's name, which a gang this
        trial starts shows in its actors' repr.

        The trial's `env_vars` (a sweep's `env.vars`) reach every rank before its process group
        forms, beside the driver's communication variables (platform.connection.COMM_ENV_VARS).
        Its `timeout_s` bounds it from rendezvous to the last rank's result; starting a gang has
        its own bound (SEQPAR_GANG_READY_TIMEOUT_S, 180 s: placement groups wait for resources).
        """
        require(isinstance(trial, Trial), "trial", type(trial).__name__,
                "must be a seqpar.case.Trial (its rules are checked when it is made)")
        if self.device == "cuda":
            import ray

            gpus = ray.cluster_resources().get("GPU", 0)
            require(trial.world <= gpus, "world", trial.world,
                    f"needs one GPU per rank; the cluster has {gpus:g}")
        result = TrialResult(trial, "FAILED", None, [], [], 0.0, 0.0, self.device)
        start = time.perf_counter()
        try:
            gang, result.gang_reused = self._acquire(trial, sweep)
        except cluster.GangStartupError as err:
            result.cause, result.failure = f"gang start-up failed: {err}", FailureKind.STARTUP
            result.setup_s = time.perf_counter() - start
            return result
        try:
            name = metrics.ascii_tag(tag) if tag else metrics.trial_tag(trial.case.label())
            self._run_on(gang, result, start, name)
        except BaseException:  # Ctrl-C or a driver-side error: no gang outlives the trial
            gang.kill()
            raise
        if result.ok:
            gang.trials += 1
            self.pool.put(gang)
        else:
            gang.kill()
        return result

    def _run_on(self, gang: cluster.Gang, result: TrialResult, start: float, tag: str) -> None:
        import ray

        trial = result.trial
        assert trial.ranks_per_node is not None
        topo = topology.resolve(gang.node_ids, trial.ranks_per_node)
        result.node_of_rank, result.topology = list(topo.node_of_rank), topo.kind
        deadline = time.monotonic() + trial.timeout_s
        wait_s = min(trial.timeout_s, 60.0)
        try:
            addr, port = ray.get(gang.actors[0].rendezvous_address.options(
                name=f"{tag}: rendezvous").remote(), timeout=wait_s)
        except ray.exceptions.GetTimeoutError:
            result.cause = f"timeout: rank 0 gave no rendezvous address within {wait_s:g} s"
            result.failure = FailureKind.STARTUP
            return
        except Exception as err:
            result.cause = f"rendezvous failed: rank 0 {_error_text(err)}"
            result.failure = (FailureKind.RANK_DIED if isinstance(err, ray.exceptions.RayActorError)
                              else FailureKind.STARTUP)
            return
        result.setup_s = time.perf_counter() - start
        meet = Rendezvous(addr, port, topo.node_of_rank, self.device)
        t0 = time.perf_counter()
        refs = {a.run_trial.options(name=tag).remote(trial, meet, tag): r
                for r, a in enumerate(gang.actors)}
        per_rank, result.cause, result.failure = self._collect(gang, refs, deadline,
                                                               trial.timeout_s)
        result.run_s = time.perf_counter() - t0
        if result.cause is None:
            result.finish(per_rank)

    def _collect(self, gang: cluster.Gang, refs: dict[Any, int], deadline: float,
                 timeout_s: float) -> tuple[list[Any], str | None, FailureKind | None]:
        """Every rank's measurement, or the cause and kind of the failure (see first_failure):
        a rank that failed, a frozen rank (`heartbeats`), or the timeout."""
        import ray

        done: dict[int, Any] = {}
        errors: dict[int, BaseException] = {}
        pending = list(refs)
        beats = Heartbeats(gang.actors, gang.info, time.monotonic())
        silent_s = connection.env_float(SILENT_ENV_VAR, DEFAULT_SILENT_S)
        end = deadline
        while pending:
            now = time.monotonic()
            if now >= end:
                break
            ready, pending = ray.wait(pending, num_returns=1, timeout=min(end - now, WATCH_S))
            for ref in ready:
                beats.heard(refs[ref])
                try:
                    done[refs[ref]] = ray.get(ref)
                except Exception as err:
                    errors[refs[ref]] = err
            if errors:  # one rank failed: the rest get a short grace to report, then the gang goes
                if ready:
                    end = min(deadline, time.monotonic() + FAILURE_GRACE_S)
                continue
            if pending and time.monotonic() - beats.last_poll >= WATCH_S:
                running = sorted(refs[p] for p in pending)
                beats.poll(running)
                frozen = beats.frozen(running, silent_s)
                if frozen:
                    return [], beats.describe(running, frozen), FailureKind.TIMEOUT
        if errors:
            first = first_failure(errors)
            others = len(errors) - 1
            more = f" (+{others} more rank{'s' if others > 1 else ''} failed)" if others else ""
            kind = failure_kind(errors[first])
            where = ""
            if kind is FailureKind.STARTUP and first < len(gang.info):  # which node lacks what
                where = f" on node {node_text(gang.info[first])}"
            return [], f"rank {first}{where} {_error_text(errors[first])}{more}", kind
        if pending:
            stuck = sorted(refs[p] for p in pending)
            beats.ask_all(stuck)  # each on its own, with its own timeout
            now = time.monotonic()
            silent = [r for r in stuck if now - beats.answered[r] >= NOTED_SILENT_S]
            return ([], f"timeout: trial exceeded {timeout_s:g} s; {beats.describe(stuck, silent)}",
                    FailureKind.TIMEOUT)
        return [done[r] for r in sorted(done)], None, None

    # -- lifetime ---------------------------------------------------------------------------------
    def close(self) -> None:
        """Kill the idle gang, remove its placement groups; leave an embedded Ray when last."""
        self.pool.evict()
        self.connection.close()

    def __enter__(self) -> TrialRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
