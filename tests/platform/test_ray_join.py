"""`--address` joins a Ray cluster someone started with `ray start` (here: a private head in a temp
dir on free ports, stopped after; never `ray stop`, which would stop every Ray on the machine), and
`cluster status` works from a fresh process."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # make test-full: the two-node tests join too

BIN = Path(sys.executable).parent
TINY_SWEEP = """\
name: joined
base:
  model: {heads: 2, kv_heads: 2, head_dim: 8}
  plan: {algorithm: ring, world: 2}
  workload: {seq_len: 32, warmup: 0, iters: 1}
  env: {device: cpu}
grid: {plan.layout: [zigzag]}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")}


@pytest.fixture(scope="module")
def ray_head():
    """A `ray start --head --block` of our own: its address, and its process tree killed after."""
    temp = tempfile.mkdtemp(prefix="sp-ray-")  # short: Ray's socket paths must fit 107 bytes
    port, client_port = free_port(), free_port()
    head = subprocess.Popen(
        [str(BIN / "ray"), "start", "--head", "--block", f"--port={port}", "--num-cpus=2",
         f"--temp-dir={temp}", "--include-dashboard=true", f"--dashboard-port={free_port()}",
         f"--dashboard-agent-listen-port={free_port()}", f"--ray-client-server-port={client_port}",
         f"--metrics-export-port={free_port()}", f"--runtime-env-agent-port={free_port()}",
         "--disable-usage-stats"],
        env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    ours: dict[tuple[int, float], psutil.Process] = {}
    try:
        deadline = time.monotonic() + 120
        while True:  # up when the GCS answers and the raylet's agents exist
            ours.update({(p.pid, p.create_time()): p
                         for p in psutil.Process(head.pid).children(recursive=True)})
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                up = any("RuntimeEnvAgent" in " ".join(p.cmdline()) for p in ours.values()
                         if p.is_running())
            except OSError:
                up = False
            if up:
                break
            assert head.poll() is None and time.monotonic() < deadline, "ray start failed"
            time.sleep(0.5)
        time.sleep(2)
        yield {"gcs": f"127.0.0.1:{port}", "client": f"ray://127.0.0.1:{client_port}"}
    finally:
        ours.update({(p.pid, p.create_time()): p
                     for p in psutil.Process(head.pid).children(recursive=True)}
                    if head.poll() is None else {})
        head.send_signal(signal.SIGTERM)  # `ray start --block` stops its own processes
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            head.kill()
        _, alive = psutil.wait_procs([p for p in ours.values() if p.is_running()], timeout=10)
        for p in alive:  # only what this head started
            p.kill()
        shutil.rmtree(temp, ignore_errors=True)


def seqpar(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "seqpar"), *args], cwd=cwd, env=env(), capture_output=True,
                          text=True, timeout=timeout)


def test_cluster_status_through_the_client_address_sees_the_joined_node(ray_head, tmp_path):
    # before: a `ray start` cluster (token authentication, Ray 2.60) refused the join. The client
    # address as the command's own option, the table (the GCS address, the global option and
    # --json: after the sweep below)
    out = seqpar("cluster", "status", "--address", ray_head["client"], cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "Ray nodes" in out.stdout and "no seqpar gangs" in out.stdout


def test_a_sweep_runs_on_the_joined_cluster_and_leaves_it_up_and_clean(ray_head, tmp_path):
    (tmp_path / "tiny.yaml").write_text(TINY_SWEEP)
    out = seqpar("--address", ray_head["gcs"], "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db",
                 "sweep", "tiny.yaml", cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "1 run, 0 failed" in out.stdout
    # cluster status from a fresh process: the joined node, and the sweep's gang went with it
    out = seqpar("--address", ray_head["gcs"], "cluster", "status", "--json", cwd=tmp_path,
                 timeout=120)
    assert out.returncode == 0, out.stderr
    status = json.loads(out.stdout)
    assert [n["cpus"] for n in status["nodes"]] == [2.0] and status["gangs"] == []
