"""`seqpar plan` starts on what a plan of presets needs: no torch, and no yaml (a cluster or plan
file's reader, imported where a file is read or written)."""

from __future__ import annotations

import subprocess
import sys

from seqpar.planner import clusters


def test_plan_starts_without_torch_or_yaml():
    code = ("import sys, seqpar.cli.app, seqpar.cli.plan; "
            "print(sorted({'yaml', 'torch'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_cluster_file_still_reads_and_writes(tmp_path):
    local = clusters.load("local")  # a file: read with yaml
    path = tmp_path / "copy.yaml"
    clusters.save(local.model_copy(update={"name": "copy"}), path)
    assert clusters.load(str(path)) == local.model_copy(update={"name": "copy"})
