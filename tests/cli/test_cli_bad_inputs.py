"""Bad input never reaches Ray or MLflow: one line naming the field, exit code 2."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from seqpar import algorithms
from seqpar.cli import app as cli_app
from seqpar.cli import options

ROOT = Path(__file__).resolve().parents[2]
GOOD_BASE = "model: tiny\n  plan: {algorithm: ring, world: 4}\n  workload: {seq_len: 256}"


def sweep_file(base: str = GOOD_BASE, grid: str = "{plan.layout: [zigzag]}", extra: str = "") -> str:
    return f"{extra}base:\n  {base}\ngrid: {grid}\n"


def base_with(plan: str = "{algorithm: ring, world: 4}", workload: str = "{seq_len: 256}",
              model: str = "tiny", env: str = "{device: cpu}") -> str:
    return f"model: {model}\n  plan: {plan}\n  workload: {workload}\n  env: {env}"


# (name, yaml text (or bytes) or None, CLI args after `seqpar`, text the one line must contain)
CASES = [
    ("missing file", None, ["sweep", "no/such/file.yaml"], "file='no/such/file.yaml'"),
    ("malformed yaml", "base: {model: tiny\n grid: [", ["sweep", "{f}"], "malformed YAML at line"),
    ("not a mapping", "- 1\n- 2\n", ["sweep", "{f}"], "must be a YAML mapping"),
    ("unknown top-level key", sweep_file(extra="colour: red\n"), ["sweep", "{f}"],
     "colour='colour': unknown key"),
    ("unknown algorithm", sweep_file(base_with(plan="{algorithm: tree, world: 4}")),
     ["sweep", "{f}"], "plan.algorithm='tree'"),
    ("unknown layout", sweep_file(grid="{plan.layout: [spiral]}"), ["sweep", "{f}"],
     "plan.layout='spiral'"),
    ("kv_heads not dividing heads", sweep_file(base_with(model="{heads: 8, kv_heads: 3}")),
     ["sweep", "{f}"], "model.kv_heads=3: must divide heads=8"),
    ("seq_len not positive", sweep_file(base_with(workload="{seq_len: 0}")),
     ["sweep", "{f}"], "workload.seq_len=0"),
    ("negative iters", sweep_file(base_with(workload="{seq_len: 256, iters: -1}")),
     ["sweep", "{f}"], "workload.iters=-1"),
    ("wrong type", sweep_file(base_with(plan="{algorithm: ring, world: four}")), ["sweep", "{f}"],
     "plan.world='four'"),
    ("unknown key in a section", sweep_file(base_with(plan="{algorithm: ring, world: 4, gpus: 8}")),
     ["sweep", "{f}"], "plan.gpus='gpus': unknown key"),
    ("option the algorithm does not take",
     sweep_file(base_with(plan="{algorithm: ring, world: 4, options: {dhp: 2}}")), ["sweep", "{f}"],
     "plan.options='dhp'"),
    ("nodes not dividing world", sweep_file(base_with(plan="{algorithm: ring, world: 4, nodes: 3}")),
     ["sweep", "{f}"], "plan.nodes=3"),
    ("unknown model preset", sweep_file(base_with(model="gpt5")), ["sweep", "{f}"],
     "model.preset='gpt5'"),
    ("unknown dtype", sweep_file(base_with(workload="{seq_len: 256, dtype: int8}")),
     ["sweep", "{f}"], "workload.dtype='int8'"),
    ("unknown link class", sweep_file(base_with(
        env="{link_emulation: {wan: {bandwidth_gb_per_s: 1}}}")), ["sweep", "{f}"],
     "env.link_emulation.wan"),
    ("unknown twin cluster", sweep_file(base_with(env="{link_emulation: {cluster: dgx-z}}")),
     ["sweep", "{f}"], "env.link_emulation.cluster='dgx-z'"),
    ("grid axis not a list", sweep_file(grid="{workload.seq_len: 512}"), ["sweep", "{f}"],
     "grid.workload.seq_len=512"),
    ("strict with one invalid point", sweep_file(grid="{workload.seq_len: [256, 0]}"),
     ["sweep", "{f}", "--strict"], "workload.seq_len=0"),
    ("unknown study", None, ["run", "everything"], "study='everything'"),
    ("unknown preset", None, ["run", "throughput", "--preset", "laptop"], "preset='laptop'"),
    ("--set without =", None, ["run", "throughput", "--set", "seq_len"], "--set='seq_len'"),
    ("--set breaking every point", None, ["run", "load-balance", "--set", "workload.seq_len=0"],
     "workload.seq_len=0"),
    ("tune with an unknown model", None, ["tune", "--model", "gpt5"], "model='gpt5'"),
    ("compare with both filters", None, ["compare", "--study", "a", "--sweep", "b"], "--study='a'"),
    ("non-UTF-8 bytes", sweep_file().encode() + b"# caf\xe9\n", ["sweep", "{f}"],
     "is not UTF-8 text (byte 0xe9"),
    ("a NUL byte", b"base: {model: tiny}\x00\n", ["sweep", "{f}"], "malformed YAML"),
    ("a directory", None, ["sweep", "."], "file='.': does not exist (or is not a file)"),
    ("negative --retries", sweep_file(), ["sweep", "{f}", "--retries", "-1"], "--retries=-1: must be"),
    ("negative --retries on run", None, ["run", "throughput", "--retries", "-2"], "--retries=-2"),
    ("negative --rerun-unstable", sweep_file(), ["sweep", "{f}", "--rerun-unstable", "-1"],
     "--rerun-unstable=-1: must be"),
    ("compare --baseline with --metric", None,
     ["compare", "--baseline", "local", "--metric", "bytes_total"], "--metric='bytes_total'"),
    ("--retries not a number", sweep_file(), ["sweep", "{f}", "--retries", "x"],
     "Invalid value for '--retries'"),
    ("unknown option", sweep_file(), ["sweep", "{f}", "--colour"], "No such option: --colour"),
    ("missing sweep file argument", None, ["sweep"], "Missing argument 'file'"),
    ("an extra argument", sweep_file(), ["sweep", "{f}", "more.yaml"], "unexpected extra argument"),
    ("unknown command", None, ["swep"], "No such command 'swep'. Did you mean 'sweep'?"),
    ("tune --iters 0", None, ["tune", "--iters", "0"], "'--iters'"),
    ("tune -P 0", None, ["tune", "-P", "0"], "world=0"),
    ("tune negative --prune", None, ["tune", "--prune", "-1"], "prune=-1"),
    ("tune negative --seq-len", None, ["tune", "--seq-len", "-8"], "workload.seq_len=-8"),
    ("tune unknown cluster", None, ["tune", "--prune", "2", "--cluster", "moon"], "cluster='moon'"),
    ("check -P 0", None, ["check", "-P", "0"], "world=0"),
    ("check unknown dtype", None, ["check", "--dtype", "int8"], "dtype='int8'"),
    ("check unknown algorithm", None, ["check", "--algorithms", "tree"], "algorithms='tree'"),
    ("check negative seq_len", None, ["check", "--seq-len", "-4"], "seq_len=-4"),
    ("cluster status malformed address", None, ["cluster", "status", "--address", "1.2.3"],
     "address='1.2.3'"),
    ("unreachable --address", None, ["--address", "127.0.0.1:1", "cluster", "status"],
     "address='127.0.0.1:1': no Ray cluster answers"),
]
if "usp" in algorithms.REGISTRY:
    CASES.append(("dhp x dcp != world", sweep_file(base_with(
        plan="{algorithm: usp, world: 4, options: {dhp: 2, dcp: 4}}")), ["sweep", "{f}"], "dhp"))
if "wallfacer" in algorithms.REGISTRY:
    CASES.append(("C^2 not dividing world", sweep_file(base_with(
        plan="{algorithm: wallfacer, world: 8, options: {team_size: 4}}", workload="{seq_len: 512}")),
        ["sweep", "{f}"], "team_size"))


@pytest.fixture
def no_backends(monkeypatch, tmp_path):
    """Fail loudly if a command gets as far as Ray or MLflow."""
    def forbidden(*args, **kwargs):
        raise AssertionError("bad input reached Ray or MLflow")

    monkeypatch.setattr(options, "trial_runner", forbidden)
    monkeypatch.setattr(options, "tracker", forbidden)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def invoke(monkeypatch, capsys, args: list[str]) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["seqpar", *args])
    with pytest.raises(SystemExit) as info:
        cli_app.main()
    return info.value.code, capsys.readouterr().err


def test_there_are_at_least_fifteen_distinct_bad_inputs():
    assert len({c[0] for c in CASES}) >= 15


@pytest.mark.parametrize(("name", "text", "args", "needle"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_touches_nothing(no_backends, monkeypatch, capsys,
                                                          name, text, args, needle):
    if isinstance(text, bytes):
        (no_backends / "bad.yaml").write_bytes(text)
    elif text is not None:
        (no_backends / "bad.yaml").write_text(text)
    args = [a.replace("{f}", "bad.yaml") for a in args]
    code, err = invoke(monkeypatch, capsys, args)
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert needle in lines[0]
    assert list(no_backends.iterdir()) in ([], [no_backends / "bad.yaml"])  # no mlflow.db


def test_the_installed_command_rejects_bad_input_fast_without_ray(tmp_path):
    (tmp_path / "bad.yaml").write_text(CASES[6][1])
    start = time.perf_counter()
    out = subprocess.run([str(Path(sys.executable).parent / "seqpar"), "sweep", "bad.yaml"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip() == ("error: model.kv_heads=3: must divide heads=8 "
                                  "(point 1: plan.layout=zigzag; no point of the sweep is valid)")
    assert "Ray" not in out.stdout + out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]
    assert time.perf_counter() - start < 60


def test_unknown_resume_id_is_refused_before_ray_starts(monkeypatch, capsys, tmp_path, fresh_store):
    def forbidden(*args, **kwargs):
        raise AssertionError("Ray started for a sweep id that does not exist")

    monkeypatch.setattr(options, "trial_runner", forbidden)
    monkeypatch.chdir(tmp_path)
    uri = fresh_store
    code, err = invoke(monkeypatch, capsys, ["--tracking-uri", uri, "sweep",
                                             str(ROOT / "examples" / "quickstart.yaml"),
                                             "--resume", "0123abcd"])
    assert code == 2 and err.strip() == f"error: resume='0123abcd': no sweep with this id in {uri}"


def test_an_unreachable_address_fails_fast_on_one_line_without_ray_noise(tmp_path):
    # before: ray.init retried the GCS for ~40 s, printing a warning every 5 s
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    start = time.perf_counter()
    out = subprocess.run([str(Path(sys.executable).parent / "seqpar"), "--address", "127.0.0.1:1",
                          "cluster", "status"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=60)
    elapsed = time.perf_counter() - start
    assert out.returncode == 2, out.stderr
    assert out.stdout == ""
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("error: address='127.0.0.1:1': no Ray cluster answers at "), line
    assert elapsed < 30, elapsed
