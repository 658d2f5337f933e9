"""Ray platform tests share the session's `ray_runner` and, through one gang id, its gang;
the two-node tests share one two-node Ray cluster."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

from tests import resources
from tests.ray_head import BIN, child_env, local_ray_head


@pytest.fixture
def gang_id() -> str:
    """One gang id for every trial here, the sweeps' too (`sweeps_share_a_gang`): consecutive
    tests of the same world reuse one gang."""
    return resources.RAY_GANG


@pytest.fixture
def assert_no_leaks():
    """Call it to assert (via ray.util.state) that no seqpar actor or placement group is left."""
    from seqpar.platform import cluster

    def check(timeout_s: float = 15.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:  # the state API trails the GCS by a moment
            actors, pgs = cluster.seqpar_actors(), cluster.seqpar_placement_groups()
            if not actors and not pgs:
                return
            assert time.monotonic() < deadline, f"leaked: {actors} {pgs}"
            time.sleep(0.25)

    return check


# A real two-node Ray cluster on this machine (ray.cluster_utils.Cluster: a head and one more node,
# 4 logical CPUs each), in a process of its own: this one may hold the session's embedded Ray.
# The head's raylet (and so each worker it starts) has HEAD_ONLY_MODULE on its path, the second
# node's not: a rank that imports it cannot start there, as on a node missing a package.
HEAD_ONLY_MODULE = "seqpar_probe_head_only"
CLUSTER_SCRIPT = """
import json, socket, sys
from ray.cluster_utils import Cluster


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ports():  # Ray's default agent ports may belong to another Ray on this machine
    return {"dashboard_agent_listen_port": free_port(), "metrics_export_port": free_port()}


path, dashboard_port = sys.argv[1], int(sys.argv[2])
cluster = Cluster(initialize_head=True, head_node_args={
    "num_cpus": 4, "include_dashboard": True, "dashboard_port": dashboard_port,
    "env_vars": {"PYTHONPATH": path}, **ports()})
cluster.add_node(num_cpus=4, **ports())
cluster.wait_for_nodes()
print(json.dumps({"gcs": cluster.address, "dashboard": "http://" + cluster.webui_url}), flush=True)
sys.stdin.read()  # until the session closes our stdin
cluster.shutdown()
"""


subprocess_env = child_env  # this environment less what would point a child at another Ray


@dataclass
class TwoNodes:
    gcs: str         # the head's GCS address (`seqpar --address`)
    dashboard: str   # http://host:port (`ray job submit --address`)
    start_s: float   # how long the cluster took to come up


@pytest.fixture(scope="module")  # a module-scoped fixture may use it
def two_nodes(tmp_path_factory):
    """The two-node cluster, started by its first test and stopped after its last
    (tests/resources.py)."""
    return resources.shared("two_nodes", lambda: _two_nodes(tmp_path_factory))


@contextlib.contextmanager
def _two_nodes(tmp_path_factory):
    path = tmp_path_factory.mktemp("head-only")
    (path / f"{HEAD_ONLY_MODULE}.py").write_text("WHERE = 'head'\n")
    with socket.socket() as s:  # 8265 may belong to another Ray on this machine
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    for attempt in range(2):  # Ray gives a raylet 30 s to register: a loaded host can miss it
        proc = subprocess.Popen([sys.executable, "-c", CLUSTER_SCRIPT, str(path), str(port)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                env=subprocess_env(), start_new_session=True)
        line = proc.stdout.readline()
        if line.startswith("{"):
            break
        _stop(proc)
        assert attempt == 0, f"the two-node cluster did not start (exit {proc.poll()})"
    try:
        yield TwoNodes(**json.loads(line), start_s=time.monotonic() - t0)
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    proc.stdin.close()  # the script shuts its cluster down
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# -- a `ray start --head` of our own (module scope) ---------------------------------------------
@pytest.fixture(scope="module")
def ray_head():
    """A local head of our own (tests/ray_head.py): its addresses, its process tree killed after."""
    with local_ray_head("sp-ray-", cpus=2) as head:
        yield head


def ray_cli(*args: str, token: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    """`ray ARGS` as a user runs it against a `ray start` head: with RAY_AUTH_MODE=token (Ray 2.60's
    job and state CLIs send the token, from ~/.ray/auth_token, RAY_AUTH_TOKEN_PATH or
    RAY_AUTH_TOKEN, only in that mode); `token=False`: as the README showed it before."""
    env = subprocess_env()
    if token:
        env["RAY_AUTH_MODE"] = "token"
    return subprocess.run([str(BIN / "ray"), *args], env=env, capture_output=True, text=True,
                          timeout=timeout)
