"""The embedded Ray dies with the `seqpar` process that started it, even on SIGKILL: without the
watchdog (platform.reaper) the raylet's DashboardAgent and RuntimeEnvAgent outlived it for good."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.ray

SEQPAR = str(Path(sys.executable).parent / "seqpar")
SLOW_SWEEP = """\
name: killed
base:
  model: {heads: 2, kv_heads: 2, head_dim: 8}
  plan: {algorithm: ring, world: 2}
  workload: {warmup: 0, iters: 200}
  env: {device: cpu, link_emulation: {intra: {latency_us: 20000, bandwidth_gb_per_s: 10}}}
grid: {workload.seq_len: [32, 64]}
"""


def tree(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


@pytest.mark.slow
def test_sigkill_of_a_sweep_leaves_no_ray_process_behind(tmp_path):
    (tmp_path / "slow.yaml").write_text(SLOW_SWEEP)
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS")}
    driver = subprocess.Popen([SEQPAR, "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db", "sweep",
                               "slow.yaml"], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    ours: dict[tuple[int, float], psutil.Process] = {}  # only this driver's processes, ever
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:  # until a rank actor runs a trial: mid-sweep
            for p in tree(driver.pid):
                try:
                    ours.setdefault((p.pid, p.create_time()), p)
                except psutil.NoSuchProcess:
                    pass
            names = " ".join(_name(p) for p in ours.values())
            if "RankWorker" in names and "DashboardAgent" in names and "RuntimeEnvAgent" in names:
                break
            assert driver.poll() is None, "the sweep ended before it could be killed"
            time.sleep(0.25)
        else:
            pytest.fail("no rank actor started within 300 s")
        ours.update({(p.pid, p.create_time()): p for p in tree(driver.pid)})
        os.kill(driver.pid, signal.SIGKILL)
        killed = time.monotonic()
        driver.wait(timeout=10)
        while True:
            left = [p for p in ours.values() if p.is_running() and p.status() != "zombie"]
            if not left or time.monotonic() - killed > 30:
                break
            time.sleep(0.25)
        assert not left, f"left running 30 s after SIGKILL: {[_name(p) for p in left]}"
        print(f"all {len(ours)} processes gone {time.monotonic() - killed:.1f} s after SIGKILL")
    finally:
        for p in ours.values():  # a red run must not leak what it started
            try:
                if p.is_running():
                    p.kill()
            except psutil.Error:
                pass
        if driver.poll() is None:
            driver.kill()


def _name(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline()) or p.name()
    except psutil.Error:
        return "?"
