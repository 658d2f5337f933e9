"""`--address` joins a Ray cluster someone started with `ray start` (here: a private head in a temp
dir on free ports, stopped after; never `ray stop`, which would stop every Ray on the machine), and
`cluster status` works from a fresh process; the driver's Ray job carries the sweep's metadata. (The
private head: tests/platform/conftest.py `ray_head`.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.platform.conftest import ray_cli, subprocess_env

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


def seqpar(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "seqpar"), *args], cwd=cwd, env=subprocess_env(),
                          capture_output=True, text=True, timeout=timeout)


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
    # the driver's job as `ray list jobs --detail` shows it (the job CLI needs RAY_AUTH_MODE=token)
    jobs = json.loads(ray_cli("list", "jobs", "--detail", "--format", "json", "--address",
                              ray_head["dashboard"]).stdout)
    drivers = [j for j in jobs if (j.get("metadata") or {}).get("seqpar_sweep") == "joined"]
    assert len(drivers) == 1 and drivers[0]["type"] == "DRIVER", jobs
    assert set(drivers[0]["metadata"]) >= {"seqpar_sweep", "seqpar_study", "seqpar_version"}
