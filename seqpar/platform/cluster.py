"""Ray connection, device detection and gangs: P rank actors held in placement groups.

The same code runs on this 2-core machine (an embedded local Ray, CPU shares, gloo) and on a
multi-node GPU cluster (an existing Ray cluster, one GPU per rank, NCCL). The actor class is passed
in (workers.rank_worker builds on the platform, not the other way round).

A gang reserves one placement group. On a cluster of several Ray nodes it has one bundle per planned
node (STRICT_SPREAD: every bundle on its own Ray node), holding that node's `ranks_per_node` ranks,
so rank r runs on the machine of planned node r // ranks_per_node; once the actors answer, their
real Ray nodes are checked against the plan (topology.check_placement) and a gang placed otherwise
is refused, never run under another map. On one Ray node (the embedded Ray) it has one bundle per
rank (STRICT_PACK) and the plan's nodes are virtual. Actors are named
`seqpar:<experiment-id>:rank-<r>` in namespace `seqpar`, so the dashboard and `seqpar cluster
status` show who is who.

Code and environment: on a cluster seqpar joined, every actor gets a runtime_env that ships the
driver's seqpar package (py_modules: the other nodes need its dependencies, torch, not seqpar
itself) and the communication variables of COMM_ENV_VARS the driver has set, before any rank
imports torch. A rank that cannot start (a module missing on its node, an import error) fails the
gang's start with its rank, node and error (GangStartupError), never the caller.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from seqpar.errors import ConfigError, SeqparError, require
from seqpar.platform import topology

NAMESPACE = "seqpar"
ACTOR_PREFIX = "seqpar:"
# every tunable: an env var and its default
READY_TIMEOUT_ENV_VAR, DEFAULT_READY_TIMEOUT_S = "SEQPAR_GANG_READY_TIMEOUT_S", 180.0
KILL_WAIT_ENV_VAR, DEFAULT_KILL_WAIT_S = "SEQPAR_GANG_KILL_WAIT_S", 20.0
CONNECT_TIMEOUT_ENV_VAR, DEFAULT_CONNECT_TIMEOUT_S = "SEQPAR_CONNECT_TIMEOUT_S", 5.0
DASHBOARD_ENV_VAR = "SEQPAR_RAY_DASHBOARD"  # "0": embedded Ray without dashboard (no state API)
# What every rank must see as the driver does, on any node: the network interfaces and fabrics
# NCCL and gloo use (on a host with several, a rendezvous on the wrong one hangs until the timeout),
# their debugging, and seqpar's own communication setting. Set on the driver (or in a sweep's
# `env.vars`), they reach each rank actor through its runtime_env, before torch.distributed starts.
COMM_ENV_VARS = (
    "NCCL_SOCKET_IFNAME", "NCCL_SOCKET_FAMILY", "NCCL_IB_HCA", "NCCL_IB_DISABLE", "NCCL_IB_GID_INDEX",
    "NCCL_NET", "NCCL_NET_GDR_LEVEL", "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_CROSS_NIC",
    "NCCL_ALGO", "NCCL_PROTO", "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS",
    "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_BLOCKING_WAIT", "TORCH_DISTRIBUTED_DEBUG",
    "SEQPAR_STRICT_COMM",
)

_embedded_users = 0  # TrialRunners sharing the embedded Ray this process started
_guard: Any = None   # the embedded Ray's watchdog (platform.reaper): its processes die with ours


class GangStartupError(RuntimeError):
    """The gang did not come up: no resources in time, a rank could not start, or the ranks are
    not where the plan puts them."""


def _env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def actor_name(experiment_id: str, rank: int) -> str:
    return f"{ACTOR_PREFIX}{experiment_id}:rank-{rank}"


def _ray_target(address: str) -> tuple[str, int]:
    """The host and port `ray.init(address)` will dial: the GCS for 'auto' / 'host:port' (as Ray
    resolves them: RAY_ADDRESS, the last `ray start` here, localhost -> this node's IP), the Ray
    Client server for 'ray://host:port'."""
    from ray._private import services  # Ray's own resolution, so the probe dials what Ray dials

    if address.startswith("ray://"):
        hostport = address[len("ray://"):].split("/", 1)[0]
    else:
        try:
            hostport = services.canonicalize_bootstrap_address_or_die(address)
        except (ConnectionError, ValueError) as err:
            raise ConfigError("address", address, f"no Ray cluster found ({_first_line(err)})") from None
    host, sep, port = hostport.rpartition(":")
    require(bool(sep and host) and port.isdigit() and 0 < int(port) < 65536, "address", address,
            "must be 'auto', 'host:port' or 'ray://host:port'")
    return host.strip("[]"), int(port)


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def _probe(address: str, timeout_s: float) -> tuple[str, int]:
    """Fail fast, on one line, when nothing listens where Ray would dial: left to itself ray.init
    retries an unreachable GCS for minutes, printing a warning every few seconds."""
    host, port = _ray_target(address)
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as err:
        why = "timed out" if isinstance(err, TimeoutError) else (err.strerror or _first_line(err))
        raise ConfigError("address", address,
                          f"no Ray cluster answers at {host}:{port} ({why})") from None
    return host, port


def _gcs_wants_token(gcs: str, timeout_s: float) -> bool:
    """Whether the GCS at `gcs` refuses a caller without a token. A driver must match its
    cluster: one that sends a token to a cluster started without authentication connects, but
    its actors are cancelled before they run."""
    from ray._raylet import GcsClient
    from ray.exceptions import AuthenticationError

    try:
        GcsClient(address=gcs).internal_kv_get(b"seqpar-probe", None, timeout=timeout_s)
    except AuthenticationError:
        return True
    except Exception:  # anything else: ray.init says it better
        return False
    return False


def _token_auth_if_available() -> None:
    """Ray >= 2.5x starts a `ray start` cluster with token authentication (~/.ray/auth_token), but
    a driver joining it sends the token only with RAY_AUTH_MODE=token: without it the GCS answers
    "Authentication token is missing". Turn it on, as Ray's own CLI does, when a token is there,
    the user has not chosen a mode and the cluster asks for one."""
    try:
        from ray._private.authentication import authentication_token_setup as auth
    except ImportError:  # a Ray without token authentication
        return
    logging.getLogger(auth.__name__).setLevel(logging.ERROR)  # "token auth is enabled" is noise
    auth.maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def connect(address: str | None = None) -> bool:
    """Join Ray (address 'auto', 'ray://...', 'host:port') or start an embedded local one (None,
    unless RAY_ADDRESS is set, as it is for the driver of a Ray job: then that cluster is joined).

    Returns True when this call started (or shares) the embedded instance, which `disconnect`
    shuts down when its last user leaves; a watchdog (platform.reaper) stops every process of it
    should this process die without doing so (a SIGKILL). A process already connected keeps its
    connection.
    An address where nothing answers within SEQPAR_CONNECT_TIMEOUT_S (5 s) is a ConfigError.
    """
    global _embedded_users, _guard
    import psutil
    import ray

    if ray.is_initialized():
        if _embedded_users:
            _embedded_users += 1
            return True
        return False
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is None:
        dashboard = os.environ.get(DASHBOARD_ENV_VAR, "1") != "0"
        me = psutil.Process()
        before = {p.pid for p in me.children()}
        # "local": always a fresh instance, never a cluster someone else started with `ray start`
        ray.init(address="local", namespace=NAMESPACE, include_dashboard=dashboard,
                 log_to_driver=False)
        _embedded_users = 1
        from seqpar.platform import reaper

        _guard = reaper.watch([p.pid for p in me.children() if p.pid not in before])
        return True
    timeout_s = _env_float(CONNECT_TIMEOUT_ENV_VAR, DEFAULT_CONNECT_TIMEOUT_S)
    host, port = _probe(address, timeout_s)
    if address.startswith("ray://") or _gcs_wants_token(f"{host}:{port}", timeout_s):
        _token_auth_if_available()
    try:
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False,
                 logging_level=logging.WARNING, runtime_env=code_runtime_env())
    except (ConnectionError, ValueError) as err:
        raise ConfigError("address", address,
                          f"no Ray cluster answered there ({_first_line(err)})") from None
    return False


def disconnect(embedded: bool) -> None:
    """Leave the embedded Ray; the last user shuts it down. Joined clusters stay up."""
    global _embedded_users, _guard
    import ray

    if not embedded or _embedded_users == 0:
        return
    _embedded_users -= 1
    if _embedded_users == 0 and ray.is_initialized():
        ray.shutdown()
    if _embedded_users == 0 and _guard is not None:
        _guard.close()  # the watchdog stops what the shutdown left behind, then exits
        _guard = None


def detect_device(override: str | None = None) -> str:
    """'cuda' when the cluster has GPUs (or when asked), else 'cpu'."""
    import ray

    gpus = ray.cluster_resources().get("GPU", 0)
    if override is not None:
        require(override in ("cpu", "cuda"), "device", override, "must be 'cpu' or 'cuda'")
        require(override == "cpu" or gpus > 0, "device", override, "the Ray cluster has no GPUs")
        return override
    return "cuda" if gpus > 0 else "cpu"


def alive_nodes() -> list[dict[str, Any]]:
    import ray

    return [n for n in ray.nodes() if n.get("Alive")]


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

    experiment_id: str
    world: int
    device: str
    ranks_per_node: int | None  # only part of the key on a multi-node cluster (placement matters)


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
        free, so a fresh gang of the same experiment can take them."""
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
                                       else _env_float(KILL_WAIT_ENV_VAR, DEFAULT_KILL_WAIT_S))
        names = [actor_name(self.key.experiment_id, r) for r in range(self.key.world)]
        while names and time.monotonic() < deadline:
            names = [n for n in names if _name_taken(n)]
            if names:
                time.sleep(0.05)


class GangPool:
    """Idle gangs kept for re-use. One pool per process: runners sharing a Ray instance (a test
    session, a sweep and its auto-tuner) must not starve each other of CPU shares or GPUs, so at most
    one gang is idle, and taking a gang of another shape first kills the idle one."""

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


POOL = GangPool()


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


def comm_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The COMM_ENV_VARS set on the driver, then `extra` (a sweep's `env.vars`) over them."""
    env = {k: os.environ[k] for k in COMM_ENV_VARS if k in os.environ}
    return {**env, **(extra or {})}


def code_runtime_env() -> dict[str, Any]:
    """The job-level runtime_env of a driver that joins a cluster: this seqpar package, shipped
    to every node (Ray uploads a local directory only at the job level: `ray.init`)."""
    import seqpar

    return {"py_modules": [os.path.dirname(os.path.abspath(seqpar.__file__))],
            "excludes": ["__pycache__", "*.pyc"]}


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

    `actor_cls(rank=, world=, experiment_id=, threads=, **init_kwargs)` must have an `info()`
    method returning its `node_id`. `env_vars`: besides the driver's COMM_ENV_VARS (see comm_env).
    Raises GangStartupError (after cleaning up) when the cluster cannot host the gang, a rank
    cannot start, or the real map is not the plan.
    """
    import ray
    from ray.exceptions import RayActorError
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    timeout = ready_timeout_s or _env_float(READY_TIMEOUT_ENV_VAR, DEFAULT_READY_TIMEOUT_S)
    world = key.world
    nodes = world // ranks_per_node
    spread = key.ranks_per_node is not None  # several Ray nodes: the plan's nodes are real
    if key.device == "cuda":
        rank_res, actor_res, threads = {"GPU": 1, "CPU": 1}, {"num_gpus": 1, "num_cpus": 1}, 1
    else:
        share = cpu_share(world, ranks_per_node, spread)
        rank_res, actor_res = {"CPU": share}, {"num_cpus": share}
        threads = max(1, int(share))
    if spread:
        alive = len(alive_nodes())
        if alive < nodes:
            raise GangStartupError(f"the plan has {nodes} nodes, the Ray cluster {alive}: "
                                   "each planned node needs a Ray node of its own")
        bundles = [{k: round(v * ranks_per_node, 4) for k, v in rank_res.items()}] * nodes
        place = [bundle_of(r, ranks_per_node) for r in range(world)]
    else:
        bundles, place = [dict(rank_res)] * world, list(range(world))
    pg = placement_group(bundles, strategy="STRICT_SPREAD" if spread else "STRICT_PACK",
                         name=f"{ACTOR_PREFIX}{key.experiment_id}:gang")
    env = comm_env(env_vars)
    runtime_env = {"env_vars": env} if env else None  # merged with the job's (the code, joined)
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
                name=actor_name(key.experiment_id, r), namespace=NAMESPACE,
                # the trial runs in one thread while another answers heartbeats
                max_concurrency=2, max_restarts=0, scheduling_strategy=strategy, **actor_res,
                **options,
            ).remote(rank=r, world=world, experiment_id=key.experiment_id, threads=threads,
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
    except BaseException:
        gang.kill()
        raise
    return gang


def _state_address() -> str:
    """The connected cluster's GCS: left to itself the state API looks for *a* local Ray and
    refuses when a machine runs several (parallel test sessions do)."""
    import ray

    return ray.get_runtime_context().gcs_address


def seqpar_actors() -> list[Any]:
    """Live seqpar actors (state API; needs the dashboard): name, state, node, pid."""
    from ray.util.state import list_actors

    actors = list_actors(address=_state_address(), filters=[("ray_namespace", "=", NAMESPACE)],
                         limit=10_000, raise_on_missing_output=False)
    return [a for a in actors if (a.name or "").startswith(ACTOR_PREFIX) and a.state != "DEAD"]


def seqpar_placement_groups() -> list[Any]:
    """Placement groups of seqpar gangs that are not removed."""
    from ray.util.state import list_placement_groups

    pgs = list_placement_groups(address=_state_address(), limit=10_000,
                                raise_on_missing_output=False)
    return [p for p in pgs if (p.name or "").startswith(ACTOR_PREFIX) and p.state != "REMOVED"]


def status() -> dict[str, Any]:
    """Nodes (CPUs, GPUs, memory) and the running seqpar gangs, grouped by experiment."""
    nodes = [{
        "node_id": n["NodeID"], "ip": n["NodeManagerAddress"],
        "cpus": n["Resources"].get("CPU", 0), "gpus": n["Resources"].get("GPU", 0),
        "memory_gb": round(n["Resources"].get("memory", 0) / 2**30, 1),
    } for n in alive_nodes()]
    gangs: dict[str, list[str]] = {}
    try:
        actors = seqpar_actors()
    except Exception as err:  # no dashboard: the state API is unavailable
        raise SeqparError(f"address: the Ray state API did not answer ({err}); "
                          "is the dashboard running?") from err
    for a in actors:
        experiment, _, rank = a.name[len(ACTOR_PREFIX):].rpartition(":")
        gangs.setdefault(experiment, []).append(f"{rank}@{(a.node_id or '')[:8]}:{a.state}")
    return {"nodes": nodes,
            "gangs": [{"experiment": e, "ranks": len(r), "actors": sorted(r)}
                      for e, r in sorted(gangs.items())]}
