"""`make gpu-check`'s script runs in its torch-only mode here: CPU ranks over gloo, every section
(machine, check, accuracy, training), one summary, and nothing imported but torch and seqpar's
torch-only layers (`seqpar.algorithms`, `seqpar.model`)."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOT_TORCH_ONLY = ("ray", "mlflow", "pydantic", "typer", "rich", "yaml", "scipy", "pandas", "psutil")


def test_the_torch_only_layers_import_nothing_but_torch_and_numpy():
    code = ("import sys; import seqpar.algorithms, seqpar.model, seqpar.model.hf; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & set(sys.argv[1:])))")
    done = subprocess.run([sys.executable, "-c", code, *NOT_TORCH_ONLY], capture_output=True,
                          text=True, check=True, cwd=ROOT)
    assert done.stdout.strip() == "[]"


def test_gpu_check_runs_torch_only_on_cpu_ranks_and_prints_one_summary():
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--device", "cpu", "--world",
         "2", "--quick", "--algorithms", "ring"],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr[-3000:]
    lines = out.splitlines()
    assert lines[-1].startswith("gpu-check PASSED: 2 cpu rank(s)")
    assert any(line.startswith("auto kernel, float32: D=64 torch-cpu-flash") for line in lines)
    assert any(line.startswith("check: 4/4 within bounds") for line in lines)
    assert any(line.startswith("accuracy: 2/2 within bounds") for line in lines)
    train = [line for line in lines if line.startswith("train ok")]
    # --quick trains a pairwise covering of (states, checkpoint, fused head): 4 of the 8 runs
    runs = {tuple(line.split()[2:5]) for line in train}
    assert len(train) == 4 and "fsdp" in train[-1] and "fused=True" in train[-1], train
    for a, b in itertools.combinations(range(3), 2):
        assert len({(r[a], r[b]) for r in runs}) == 4, (a, b, runs)
    assert "imports: torch-only" in lines
