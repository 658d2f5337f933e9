"""`seqpar sweep examples/quickstart.yaml` as a user runs it: a subprocess, its own embedded Ray, a
temporary MLflow store (the session's `quickstart` fixture, tests/conftest.py, run once and also
shown in the browser by tests/ui); then every run is read back, and `seqpar compare` prints the
table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from seqpar.platform.tracking import Tracker

pytestmark = pytest.mark.ray

SEQPAR = str(Path(sys.executable).parent / "seqpar")


def seqpar(*args: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS")}
    return subprocess.run([SEQPAR, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_quickstart_sweep_lands_in_mlflow_and_compares(quickstart, tmp_path):
    out, uri = quickstart, quickstart.uri
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "best by tokens_per_s" in out.stdout
    assert "compare in MLflow: http://127.0.0.1:5000/#/compare-runs?runs=%5B%22" in out.stdout
    assert "OVERSUBSCRIBED" not in out.stdout and "flags: O" not in out.stdout  # a rank a core

    tracker = Tracker(uri)
    sweep = tracker.client.get_run(quickstart.sweep_id).info
    assert sweep.status == "FINISHED"
    assert tracker.experiment_name(sweep) == "quickstart"
    runs = tracker.trials(sweep.run_id)
    assert len(runs) == 8
    assert {(r.params["plan.algorithm"], r.params["workload.seq_len"]) for r in runs} == {
        (a, n) for a in ("local", "allgather", "ulysses", "ring") for n in ("2048", "4096")}
    for run in runs:
        assert run.status == "FINISHED", run.tags.get("seqpar.cause")
        for metric in ("step_ms", "step_ms_p10", "step_ms_p90", "fwd_ms", "bwd_ms", "tokens_per_s",
                       "tokens_per_s_per_rank", "attn_tflops", "peak_mem_bytes", "bytes_total",
                       "load_imbalance"):
            assert metric in run.metrics, (run.name, metric)
        assert tracker.artifacts(run.run_id) == ["per_rank.json"]
        detail = json.loads(Path(tracker.client.download_artifacts(
            run.run_id, "per_rank.json", str(tmp_path))).read_text())
        assert len(detail["per_rank"]) == int(run.params["plan.world"])
        sent = run.metrics["bytes_total"]
        assert (sent == 0) == (run.params["plan.algorithm"] == "local")
    assert not (quickstart.workdir / "mlflow.db").exists()  # --tracking-uri wins over the default

    shown = seqpar("--tracking-uri", uri, "compare", "--sweep", quickstart.sweep_id, "--json",
                   cwd=tmp_path, timeout=120)
    assert shown.returncode == 0, shown.stderr
    rows = json.loads(shown.stdout)
    assert len(rows) == 8 and {r["status"] for r in rows} == {"FINISHED"}
    assert {r["x local"] for r in rows if r["algorithm"] == "local"} == {"1.00"}
