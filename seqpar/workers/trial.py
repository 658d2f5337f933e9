"""Run Cases on Ray: one trial = one Case on one gang of rank actors.

    with TrialRunner() as runner:                      # embedded local Ray, cpu + gloo here
        result = runner.run(Case("ring", world=4), nodes=2,
                            link_emulation={"inter": LinkModel(1e-3, 1e9)})
        print(result.status, result.metrics()["step_ms"])

Bad input raises a SeqparError before any actor starts; anything that goes wrong after that ends
the trial FAILED with its cause and its kind (`result.failure`: a rank raised, a rank died, a
timeout, or start-up), kills the gang and leaves nothing behind; the next trial gets a fresh gang.
A healthy gang is kept for the next trial of the same experiment, world size and device kind
(start-up is the expensive part).
Ctrl-C tears the gang down before the KeyboardInterrupt propagates.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from seqpar.algorithms.comm import LinkModel
from seqpar.case import Case, TrainCase
from seqpar.errors import require
from seqpar.platform import cluster, connection, topology
from seqpar.workers.rank_worker import RankTrial, RankWorker
from seqpar.workers.result import FailureKind, TrialResult

__all__ = ["FailureKind", "TrialResult", "TrialRunner", "validate"]

FAILURE_GRACE_S = 2.0  # after one rank fails, how long the others get to report theirs


def validate(case: Case | TrainCase, nodes: int, ranks_per_node: int | None,
             link_emulation: dict[str, LinkModel] | None, timeout_s: float) -> int:
    """Every rule a trial's input must keep: the case's own (`validate()`) and the run's (plan,
    link emulation, timeout); returns ranks_per_node. Raises ConfigError."""
    require(isinstance(case, Case | TrainCase), "case", type(case).__name__,
            "must be a seqpar Case or TrainCase")
    case.validate()
    _, rpn = topology.plan_shape(case.world, nodes, ranks_per_node)
    for link, model in (link_emulation or {}).items():
        require(link in ("intra", "inter"), "link_emulation", link, "keys are 'intra' and 'inter'")
        require(isinstance(model, LinkModel), f"link_emulation[{link}]", model,
                "must be a LinkModel(latency_s, bandwidth_bytes_per_s)")
        require(model.latency_s >= 0, f"link_emulation[{link}].latency_s", model.latency_s,
                "must be >= 0")
        require(model.bandwidth_bytes_per_s > 0, f"link_emulation[{link}].bandwidth_bytes_per_s",
                model.bandwidth_bytes_per_s, "must be > 0")
    require(timeout_s > 0, "timeout_s", timeout_s, "must be > 0")
    return rpn


def _emulation_record(links: dict[str, LinkModel] | None) -> dict | None:
    if not links:
        return None
    return {k: {"latency_s": m.latency_s, "bandwidth_bytes_per_s": m.bandwidth_bytes_per_s}
            for k, m in sorted(links.items())}


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

    def __init__(self, address: str | None = None, device: str | None = None):
        self._embedded = connection.connect(address)
        self.device = connection.detect_device(device)
        self.default_experiment_id = f"adhoc-{secrets.token_hex(3)}"

    # -- gangs ------------------------------------------------------------------------------------
    def _acquire(self, key: cluster.GangKey, rpn: int) -> tuple[cluster.Gang, bool]:
        gang = cluster.POOL.take(key)  # kills an idle gang of another shape: frees its resources
        if gang is not None and self._healthy(gang):
            return gang, True
        if gang is not None:
            gang.kill()
        return cluster.start_gang(RankWorker, key, rpn, env_vars=dict(key.env)), False

    @staticmethod
    def _healthy(gang: cluster.Gang) -> bool:
        import ray

        try:
            ray.get([a.heartbeat.remote() for a in gang.actors], timeout=10)
        except Exception:  # a rank died between trials (node loss, OOM kill): start afresh
            return False
        return True

    # -- trials -----------------------------------------------------------------------------------
    def run(self, case: Case | TrainCase, *, nodes: int = 1, ranks_per_node: int | None = None,
            link_emulation: dict[str, LinkModel] | None = None, timeout_s: float = 300.0,
            experiment_id: str | None = None,
            env_vars: dict[str, str] | None = None) -> TrialResult:
        """One trial; never raises for a failing trial (status FAILED, cause set).

        `env_vars` (a sweep's `env.vars`) reach every rank before its process group forms, beside
        the driver's communication variables (platform.connection.COMM_ENV_VARS).

        `timeout_s` bounds the trial from rendezvous to the last rank's result; starting a gang
        has its own bound (SEQPAR_GANG_READY_TIMEOUT_S, 180 s: placement groups wait for resources).
        """
        rpn = validate(case, nodes, ranks_per_node, link_emulation, timeout_s)
        if self.device == "cuda":
            import ray

            gpus = ray.cluster_resources().get("GPU", 0)
            require(case.world <= gpus, "world", case.world,
                    f"needs one GPU per rank; the cluster has {gpus:g}")
        exp = experiment_id or self.default_experiment_id
        multi_node = len(connection.alive_nodes()) > 1  # asked each time: clusters grow and shrink
        key = cluster.GangKey(exp, case.world, self.device, rpn if multi_node else None,
                              tuple(sorted((env_vars or {}).items())))
        result = TrialResult(case, "FAILED", None, [], [], _emulation_record(link_emulation),
                             0.0, 0.0, self.device, experiment_id=exp)
        start = time.perf_counter()
        try:
            gang, result.gang_reused = self._acquire(key, rpn)
        except cluster.GangStartupError as err:
            result.cause, result.failure = f"gang start-up failed: {err}", FailureKind.STARTUP
            result.setup_s = time.perf_counter() - start
            return result
        try:
            self._run_on(gang, result, rpn, link_emulation, timeout_s, start)
        except BaseException:  # Ctrl-C or a driver-side error: no gang outlives the trial
            gang.kill()
            raise
        if result.ok:
            gang.trials += 1
            cluster.POOL.put(gang)
        else:
            gang.kill()
        return result

    def _run_on(self, gang: cluster.Gang, result: TrialResult, rpn: int,
                links: dict[str, LinkModel] | None, timeout_s: float, start: float) -> None:
        import ray

        topo = topology.resolve(gang.node_ids, rpn)
        result.node_of_rank, result.topology = list(topo.node_of_rank), topo.kind
        deadline = time.monotonic() + timeout_s
        wait_s = min(timeout_s, 60.0)
        try:
            addr, port = ray.get(gang.actors[0].rendezvous_address.remote(), timeout=wait_s)
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
        trial = RankTrial(result.case, result.experiment_id or "", addr, port, topo.node_of_rank,
                          links, self.device, timeout_s)
        t0 = time.perf_counter()
        refs = {a.run_trial.remote(trial): r for r, a in enumerate(gang.actors)}
        per_rank, result.cause, result.failure = self._collect(gang, refs, deadline, timeout_s)
        result.run_s = time.perf_counter() - t0
        if result.cause is None:
            result.per_rank, result.status = per_rank, "FINISHED"

    def _collect(self, gang: cluster.Gang, refs: dict[Any, int], deadline: float,
                 timeout_s: float) -> tuple[list[Any], str | None, FailureKind | None]:
        """Every rank's measurement, or the cause and kind of the failure (see first_failure)."""
        import ray

        done: dict[int, Any] = {}
        errors: dict[int, BaseException] = {}
        pending = list(refs)
        while pending:
            remaining = deadline - time.monotonic()
            if errors:  # one rank failed: the rest get a short grace to report, then the gang goes
                remaining = min(remaining, FAILURE_GRACE_S)
            ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, remaining))
            if not ready:
                break
            for ref in ready:
                try:
                    done[refs[ref]] = ray.get(ref)
                except Exception as err:
                    errors[refs[ref]] = err
        if errors:
            first = first_failure(errors)
            others = len(errors) - 1
            more = f" (+{others} more rank{'s' if others > 1 else ''} failed)" if others else ""
            kind = failure_kind(errors[first])
            where = ""
            if kind is FailureKind.STARTUP and first < len(gang.info):  # which node lacks what
                node = gang.info[first]
                where = f" on node {node.get('ip', '?')} ({str(node.get('node_id', ''))[:8]})"
            return [], f"rank {first}{where} {_error_text(errors[first])}{more}", kind
        if pending:
            stuck = sorted(refs[p] for p in pending)
            return ([], f"timeout: trial exceeded {timeout_s:g} s; {self._phases(gang, stuck)}",
                    FailureKind.TIMEOUT)
        return [done[r] for r in sorted(done)], None, None

    @staticmethod
    def _phases(gang: cluster.Gang, ranks: list[int]) -> str:
        """Where the stuck ranks are, asked through the actors' second thread."""
        import ray

        try:
            beats = ray.get([gang.actors[r].heartbeat.remote() for r in ranks], timeout=5)
            return "ranks still running: " + ", ".join(
                f"{b['rank']} in {b['phase']!r} for {b['phase_s']:.1f} s" for b in beats)
        except Exception:
            return f"ranks still running: {ranks}"

    # -- lifetime ---------------------------------------------------------------------------------
    def close(self) -> None:
        """Kill the idle gang, remove its placement groups; leave an embedded Ray when last."""
        cluster.POOL.evict()
        connection.disconnect(self._embedded)
        self._embedded = False

    def __enter__(self) -> TrialRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
