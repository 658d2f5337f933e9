"""The Ray connection: join a cluster (with seqpar's code for every node) or start an embedded one.

    conn = connect(address)      # a Connection: what this process's link to Ray is
    conn.rank_env_vars(extra)    # what a gang's ranks must be started with
    conn.close()                 # an embedded Ray (and its watchdog) goes with the one who started it

The same code runs on this 2-core machine (an embedded local Ray, CPU shares, gloo) and on a
multi-node GPU cluster (an existing Ray cluster, one GPU per rank, NCCL). A driver that joins a
cluster ships this seqpar package to every node with the job's runtime_env (py_modules), so the
other nodes need its dependencies (torch, and flash-attn for the CUDA kernels), not seqpar itself.
The connection is state passed to whoever needs it (the TrialRunner holds it), not module state:
a process keeps one (share the TrialRunner, as the test session and the CLI's tests do).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import seqpar
from seqpar.errors import ConfigError, require
from seqpar.platform import reaper

NAMESPACE = "seqpar"
CONNECT_TIMEOUT_ENV_VAR, DEFAULT_CONNECT_TIMEOUT_S = "SEQPAR_CONNECT_TIMEOUT_S", 5.0
CLIENT_ATTEMPTS = 3  # a ray:// connection whose per-client server was slow to start
DASHBOARD_ENV_VAR = "SEQPAR_RAY_DASHBOARD"  # "0": embedded Ray without dashboard (no state API)
# how often the embedded Ray's processes export their metrics (Ray's default: 10 s); a joined
# cluster keeps its own (`RAY_metrics_report_interval_ms` where `ray start` runs)
METRICS_INTERVAL_ENV_VAR, DEFAULT_METRICS_INTERVAL_MS = "SEQPAR_METRICS_REPORT_MS", 2000
# the Ray job's metadata (`JobConfig(metadata=)`, `ray list jobs --detail`); the same keys are the
# ones to give `ray job submit --metadata-json`
JOB_METADATA_KEYS = ("seqpar_sweep", "seqpar_study", "seqpar_version")
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


@dataclass
class Connection:
    """This process's connection to Ray. `embedded`: it started a local Ray, which `close` stops
    (with the watchdog that stops it should this process die first: platform.reaper); a joined
    cluster, or a Ray someone else in this process started, stays up. `inherited`: the
    COMM_ENV_VARS the embedded Ray's processes started with."""

    embedded: bool = False
    inherited: dict[str, str] = field(default_factory=dict)
    guard: Any = None

    def rank_env_vars(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """What a rank actor's runtime_env must set for it to see comm_env(extra): all of it on a
        joined cluster; on the embedded Ray, whose processes inherited the driver's environment
        when it started, only what changed since (so a gang starts on Ray's prestarted workers)."""
        env = comm_env(extra)
        if self.embedded:
            env = {k: v for k, v in env.items() if self.inherited.get(k) != v}
        return env

    def close(self) -> None:
        """Stop the embedded Ray this connection started; leave anything else up."""
        import ray

        if not self.embedded:
            return
        self.embedded = False
        if ray.is_initialized():
            ray.shutdown()
        if self.guard is not None:
            self.guard.close()  # the watchdog stops what the shutdown left behind, then exits
            self.guard = None



def env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


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


def job_metadata(sweep: str, study: str | None = None) -> dict[str, str]:
    """What a sweep's driver tells Ray about its job (JOB_METADATA_KEYS)."""
    return dict(zip(JOB_METADATA_KEYS, (sweep, study or "", seqpar.__version__), strict=True))


def connect(address: str | None = None, ship_code: bool = True,
            metadata: dict[str, str] | None = None) -> Connection:
    """Join Ray (address 'auto', 'ray://...', 'host:port') or start an embedded local one (None,
    unless RAY_ADDRESS is set, as it is for the driver of a Ray job: then that cluster is joined).

    The Connection says whether this call started the embedded instance, which its `close` shuts
    down; a watchdog (platform.reaper) stops every process of it should this process die without
    doing so (a SIGKILL). A process already connected keeps its connection (and this one does not
    own it). An address where nothing answers within SEQPAR_CONNECT_TIMEOUT_S (5 s) is a
    ConfigError. `ship_code`: a joined cluster's job carries this seqpar package
    (code_runtime_env); a caller that starts no actor (`seqpar cluster status`) spares the upload.
    `metadata`: the job's (JobConfig); a job submitted with `ray job submit --metadata-json` keeps
    the submission's values where both name a key.
    """
    import psutil
    import ray
    from ray.job_config import JobConfig

    if ray.is_initialized():
        return Connection()
    job = JobConfig(metadata=dict(metadata)) if metadata else None
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is None:
        dashboard = os.environ.get(DASHBOARD_ENV_VAR, "1") != "0"
        me = psutil.Process()
        before = {p.pid for p in me.children()}
        # "local": always a fresh instance, never a cluster someone else started with `ray start`
        interval = int(env_float(METRICS_INTERVAL_ENV_VAR, DEFAULT_METRICS_INTERVAL_MS))
        ray.init(address="local", namespace=NAMESPACE, include_dashboard=dashboard,
                 log_to_driver=False, job_config=job,
                 _system_config={"metrics_report_interval_ms": interval})
        started = [p.pid for p in me.children() if p.pid not in before]
        return Connection(embedded=True, inherited=comm_env(), guard=reaper.watch(started))
    timeout_s = env_float(CONNECT_TIMEOUT_ENV_VAR, DEFAULT_CONNECT_TIMEOUT_S)
    host, port = _probe(address, timeout_s)
    if address.startswith("ray://") or _gcs_wants_token(f"{host}:{port}", timeout_s):
        _token_auth_if_available()
    for attempt in range(CLIENT_ATTEMPTS):
        try:
            ray.init(address=address, namespace=NAMESPACE, log_to_driver=False,
                     logging_level=logging.WARNING, job_config=job,
                     runtime_env=code_runtime_env() if ship_code else None)
            return Connection()
        except (ConnectionError, ValueError) as err:
            # a Ray client server starts a server per connection; on a busy head that start can
            # miss its deadline ("Initialization failure from server"): worth another try
            slow_start = address.startswith("ray://") and "Initialization failure" in str(err)
            if not slow_start or attempt == CLIENT_ATTEMPTS - 1:
                raise ConfigError("address", address,
                                  f"no Ray cluster answered there ({_first_line(err)})") from None
            time.sleep(2.0 * (attempt + 1))
    raise AssertionError("unreachable: the last attempt raises")


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


def code_runtime_env() -> dict[str, Any]:
    """The job-level runtime_env of a driver that joins a cluster: this seqpar package, shipped
    to every node (Ray uploads a local directory only at the job level: `ray.init`)."""
    return {"py_modules": [os.path.dirname(os.path.abspath(seqpar.__file__))],
            "excludes": ["__pycache__", "*.pyc"]}


def comm_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The COMM_ENV_VARS set on the driver, then `extra` (a sweep's `env.vars`) over them."""
    env = {k: os.environ[k] for k in COMM_ENV_VARS if k in os.environ}
    return {**env, **(extra or {})}
