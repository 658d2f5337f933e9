"""A sweep that cannot reach its cluster writes nothing: no MLflow store, no lock beside it."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() if p.is_file() else b"<dir>"
            for p in sorted(d.rglob("*"))}


def test_a_sweep_on_an_unreachable_address_leaves_the_directory_as_it_was(tmp_path):
    (tmp_path / "notes.txt").write_text(secrets.token_hex(8))  # what was there stays, unchanged
    before = _snapshot(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")}
    out = subprocess.run([str(Path(sys.executable).parent / "seqpar"), "--address", "127.0.0.1:1",
                          "sweep", str(ROOT / "examples" / "quickstart.yaml")], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("error: address='127.0.0.1:1': no Ray cluster answers"), line
    assert _snapshot(tmp_path) == before  # no mlflow.db, no mlflow.db.lock, no mlartifacts
