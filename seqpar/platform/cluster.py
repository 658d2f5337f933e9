"""Gangs: P rank actors held in a placement group (the connection itself: platform.connection).
The actor class is passed in (workers.rank_worker builds on the platform, not the other way round).

A gang reserves one placement group. On a cluster of several Ray nodes it has one bundle per planned
node (STRICT_SPREAD: every bundle on its own Ray node), holding that node's `ranks_per_node` ranks,
so rank r runs on the machine of planned node r // ranks_per_node; once the actors answer, their
real Ray nodes are checked against the plan (topology.check_placement) and a gang placed otherwise
is refused, never run under another map. On one Ray node (the embedded Ray) it has one bundle per
rank (STRICT_PACK) and the plan's nodes are virtual. Actors are named
`seqpar:<gang id>:rank-<r>` in namespace `seqpar`, so the dashboard and `seqpar cluster status`
show who is who.

Environment: every actor gets the variables it is started with in its runtime_env (the caller's
`Connection.rank_env_vars`: the communication variables of connection.COMM_ENV_VARS the driver has
set, and a sweep's own; on a cluster seqpar joined the job's runtime_env also carries seqpar's
code), before any rank imports torch. A rank that cannot start (a module missing
on its node, an import error) fails the gang's start with its rank, node and error
(GangStartupError), never the caller.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from seqpar.errors import SeqparError, require
from seqpar.platform import dashboard, metrics, topology
from seqpar.platform.connection import NAMESPACE, alive_nodes, env_float

ACTOR_PREFIX = "seqpar:"
# every tunable: an env var and its default
READY_TIMEOUT_ENV_VAR, DEFAULT_READY_TIMEOUT_S = "SEQPAR_GANG_READY_TIMEOUT_S", 180.0
KILL_WAIT_ENV_VAR, DEFAULT_KILL_WAIT_S = "SEQPAR_GANG_KILL_WAIT_S", 20.0


class GangStartupError(RuntimeError):
    """The gang did not come up: no resources in time, a rank could not start, or the ranks are
    not where the plan puts them."""


def actor_name(gang_id: str, rank: int) -> str:
    return f"{ACTOR_PREFIX}{gang_id}:rank-{rank}"


def cpu_share(world: int, ranks_per_node: int, spread: bool = False) -> float:
    """CPUs one rank reserves: a whole CPU where the cluster has them, else an equal fraction, so
    8 ranks fit on 2 cores (the gloo ranks time-share them; timings say so, bytes do not care).
    `spread`: each planned node on its own Ray node, so the smallest of the biggest `nodes` Ray
    nodes must hold `ranks_per_node` shares."""
    cpus = sorted((n["Resources"].get("CPU", 0) for n in alive_nodes()), reverse=True)
    total = sum(cpus)
    nodes = world // ranks_per_node
    host = (cpus[nodes - 1] if len(cpus) >= nodes else 0) if spread else (cpus or [0])[0]
    share = min(1.0, total / world, host / ranks_per_node)
    share = math.floor(share * 100) / 100  # Ray resources are exact to 1e-4; keep a margin
    require(share > 0, "world", world, f"the Ray cluster's {total:g} CPUs cannot host {world} ranks")
    return share


@dataclass(frozen=True)
class GangKey:
    """Gangs with equal keys are interchangeable; a trial reuses one whose key matches."""

    gang_id: str
    world: int
    device: str
    ranks_per_node: int | None  # only part of the key on a multi-node cluster (placement matters)
    env: tuple[tuple[str, str], ...] = ()  # the sweep's env.vars: ranks started with them


@dataclass
class Gang:
    """P rank actors in a placement group; `actors[r]` is rank r."""

    key: GangKey
    actors: list[Any]
    placement_groups: list[Any]
    info: list[dict[str, Any]] = field(default_factory=list)  # per rank: node_id, ip, pid
    trials: int = 0
    dead: bool = False

    @property
    def node_ids(self) -> list[str]:
        return [i["node_id"] for i in self.info]

    def kill(self, wait_s: float | None = None) -> None:
        """Kill every actor, remove the placement groups and wait (bounded) until the names are
        free, so a fresh gang of the same id can take them."""
        import ray
        from ray.util.placement_group import remove_placement_group

        self.dead = True
        for actor in self.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # already dead: nothing to do
                pass
        for pg in self.placement_groups:
            try:
                remove_placement_group(pg)
            except Exception:
                pass
        deadline = time.monotonic() + (wait_s if wait_s is not None
                                       else env_float(KILL_WAIT_ENV_VAR, DEFAULT_KILL_WAIT_S))
        names = [actor_name(self.key.gang_id, r) for r in range(self.key.world)]
        while names and time.monotonic() < deadline:
            names = [n for n in names if _name_taken(n)]
            if names:
                time.sleep(0.05)


class GangPool:
    """Idle gangs kept for re-use, by the TrialRunner that made the pool: at most one gang is idle
    (gangs must not starve each other of CPU shares or GPUs), and taking a gang of another shape
    first kills the idle one."""

    def __init__(self) -> None:
        self._idle: Gang | None = None

    def take(self, key: GangKey) -> Gang | None:
        """The idle gang when its key matches; otherwise None, with the idle gang killed."""
        gang, self._idle = self._idle, None
        if gang is not None and gang.key == key and not gang.dead:
            return gang
        if gang is not None:
            gang.kill()
        return None

    def put(self, gang: Gang) -> None:
        self.evict()
        self._idle = gang

    def evict(self) -> None:
        gang, self._idle = self._idle, None
        if gang is not None:
            gang.kill()



def _name_taken(name: str) -> bool:
    import ray

    try:
        ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return False
    return True


def bundle_of(rank: int, ranks_per_node: int) -> int:
    """The bundle (= planned node) that holds `rank` in a gang spread over Ray nodes."""
    return rank // ranks_per_node


def _node_names() -> dict[str, str]:
    return {n["NodeID"]: n["NodeManagerAddress"] for n in alive_nodes()}


def _startup_error(err: BaseException) -> str:
    """The one line that says why an actor could not start (the creation task's exception)."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    cause = [ln for ln in lines if ln.split(":", 1)[0].endswith(("Error", "Exception"))
             and not ln.startswith(("ray.exceptions", "The actor"))]
    return (cause[-1] if cause else " ".join(lines[:2]))[:300]


def _rank_node(pg: Any, bundle: int) -> str:
    """`ip (node id[:8])` of a placement group's bundle."""
    from ray.util import placement_group_table

    node_id = placement_group_table(pg).get("bundles_to_node_id", {}).get(bundle, "")
    return f"{_node_names().get(node_id, '?')} ({node_id[:8] or '?'})"


def start_gang(actor_cls: type, key: GangKey, ranks_per_node: int, *,
               init_kwargs: dict[str, Any] | None = None,
               ready_timeout_s: float | None = None,
               env_vars: dict[str, str] | None = None) -> Gang:
    """Reserve the placement group, start one actor per rank, wait until each answers `info()`,
    and on several Ray nodes check that the ranks are where the plan puts them.

    `actor_cls(rank=, world=, gang_id=, threads=, **init_kwargs)` must have an `info()`
    method returning its `node_id`. `env_vars`: what every rank's runtime_env sets
    (`Connection.rank_env_vars`).
    Raises GangStartupError (after cleaning up) when the cluster cannot host the gang, a rank
    cannot start, or the real map is not the plan.
    """
    import ray
    from ray.exceptions import RayActorError, RayError
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    timeout = ready_timeout_s or env_float(READY_TIMEOUT_ENV_VAR, DEFAULT_READY_TIMEOUT_S)
    world = key.world
    nodes = world // ranks_per_node
    spread = key.ranks_per_node is not None  # several Ray nodes: the plan's nodes are real
    alive = len(alive_nodes())
    if spread and alive < nodes:
        raise GangStartupError(f"the plan has {nodes} nodes, the Ray cluster {alive}: "
                               "each planned node needs a Ray node of its own")
    if key.device == "cuda":
        rank_res, actor_res, threads = {"GPU": 1, "CPU": 1}, {"num_gpus": 1, "num_cpus": 1}, 1
    else:
        share = cpu_share(world, ranks_per_node, spread)
        rank_res, actor_res = {"CPU": share}, {"num_cpus": share}
        threads = max(1, int(share))
    if spread:
        bundles = [{k: round(v * ranks_per_node, 4) for k, v in rank_res.items()}] * nodes
        place = [bundle_of(r, ranks_per_node) for r in range(world)]
    else:
        bundles, place = [dict(rank_res)] * world, list(range(world))
    pg = placement_group(bundles, strategy="STRICT_SPREAD" if spread else "STRICT_PACK",
                         name=f"{ACTOR_PREFIX}{key.gang_id}:gang")
    runtime_env = {"env_vars": dict(env_vars)} if env_vars else None  # merged with the job's
    remote_cls = ray.remote(actor_cls)
    gang = Gang(key, [], [pg])
    try:
        ready, _ = ray.wait([pg.ready()], timeout=timeout)
        if not ready:
            raise GangStartupError(
                f"placement group for {world} ranks ({len(bundles)} bundles of {bundles[0]}, "
                f"{'STRICT_SPREAD' if spread else 'STRICT_PACK'}) not ready within {timeout:.0f} s:"
                " the cluster lacks the resources")
        for r in range(world):
            strategy = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=place[r])
            options: dict[str, Any] = {"runtime_env": runtime_env} if runtime_env else {}
            gang.actors.append(remote_cls.options(
                name=actor_name(key.gang_id, r), namespace=NAMESPACE,
                # the trial runs in one thread while another answers heartbeats
                max_concurrency=2, max_restarts=0, scheduling_strategy=strategy, **actor_res,
                **options,
            ).remote(rank=r, world=world, gang_id=key.gang_id, threads=threads,
                     **(init_kwargs or {})))
        refs = [a.info.remote() for a in gang.actors]
        ready, _ = ray.wait(refs, num_returns=world, timeout=timeout)
        if len(ready) < world:
            raise GangStartupError(f"{world - len(ready)} of {world} rank actors did not start "
                                   f"within {timeout:.0f} s")
        info: list[dict[str, Any]] = []
        for r, ref in enumerate(refs):
            try:
                info.append(ray.get(ref))
            except RayActorError as err:
                raise GangStartupError(f"rank {r} could not start on node "
                                       f"{_rank_node(pg, place[r])}: {_startup_error(err)}"
                                       ) from None
        gang.info = info
        if spread:
            topology.check_placement(gang.node_ids, ranks_per_node)
    except topology.PlacementError as err:
        gang.kill()
        raise GangStartupError(str(err)) from None
    except RayError as err:  # e.g. an actor's creation cancelled: Ray's, never the caller's
        gang.kill()
        raise GangStartupError(f"the rank actors could not be created: {type(err).__name__}: "
                               f"{_startup_error(err)}") from None
    except BaseException:
        gang.kill()
        raise
    return gang


def _state_address() -> str:
    """The connected cluster's GCS: left to itself the state API looks for *a* local Ray and
    refuses when a machine runs several (parallel test sessions do)."""
    import ray

    return ray.get_runtime_context().gcs_address


def seqpar_actors(detail: bool = False) -> list[Any]:
    """Live seqpar actors (state API; needs the dashboard): name, state, node, pid (`detail`:
    also their repr, which names the sweep)."""
    from ray.util.state import list_actors

    actors = list_actors(address=_state_address(), filters=[("ray_namespace", "=", NAMESPACE)],
                         limit=10_000, raise_on_missing_output=False, detail=detail)
    return [a for a in actors if (a.name or "").startswith(ACTOR_PREFIX) and a.state != "DEAD"]


def seqpar_placement_groups() -> list[Any]:
    """Placement groups of seqpar gangs that are not removed."""
    from ray.util.state import list_placement_groups

    pgs = list_placement_groups(address=_state_address(), limit=10_000,
                                raise_on_missing_output=False)
    return [p for p in pgs if (p.name or "").startswith(ACTOR_PREFIX) and p.state != "REMOVED"]


def running_trials() -> dict[str, str]:
    """actor id -> the name of the trial it runs now (its RUNNING `run_trial` task's name)."""
    from ray.util.state import list_tasks

    tasks = list_tasks(address=_state_address(), filters=[("state", "=", "RUNNING")],
                       limit=10_000, raise_on_missing_output=False)
    return {t.actor_id: t.name for t in tasks
            if t.actor_id and (t.func_or_class_name or "").endswith(".run_trial")}


def status() -> dict[str, Any]:
    """Nodes (CPUs, GPUs, memory), the running seqpar gangs by gang id, and each sweep's progress
    (platform.dashboard.sweep_progress: the state API and the metrics)."""
    nodes = [{
        "node_id": n["NodeID"], "ip": n["NodeManagerAddress"],
        "cpus": n["Resources"].get("CPU", 0), "gpus": n["Resources"].get("GPU", 0),
        "memory_gb": round(n["Resources"].get("memory", 0) / 2**30, 1),
    } for n in alive_nodes()]
    gangs: dict[str, list[str]] = {}
    try:
        actors = seqpar_actors(detail=True)
        running = running_trials()
    except Exception as err:  # no dashboard: the state API is unavailable
        raise SeqparError(f"address: the Ray state API did not answer ({err}); "
                          "is the dashboard running?") from err
    for a in actors:
        gang, _, rank = a.name[len(ACTOR_PREFIX):].rpartition(":")
        gangs.setdefault(gang, []).append(f"{rank}@{(a.node_id or '')[:8]}:{a.state}")
    samples = metrics.scrape(metrics.endpoints(alive_nodes()))
    return {"nodes": nodes,
            "gangs": [{"gang": g, "ranks": len(r), "actors": sorted(r)}
                      for g, r in sorted(gangs.items())],
            "sweeps": dashboard.sweep_progress(actors, running, samples)}
