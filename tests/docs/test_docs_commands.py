"""Every command and runnable Python block the manual shows (README.md, docs/*.md) is run, so a
renamed flag, a removed preset or a stale example fails the suite: every `seqpar` line is parsed by
the CLI; quick ones run in this process (sweeps as --dry-run), `compare` / `report` on the store of
the session's quickstart sweep, `check` on the session's gloo gang; long ones, `cluster status` and
the `ray job` lines (against a local head) in make test-full; placeholders and GPU lines are parsed
and skipped with the reason. The rules: tests/docs/collect.py and docs/development.md."""

from __future__ import annotations

import contextlib
import copy
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main

from seqpar.cli import app as cli_app
from tests.docs.collect import (
    PAGES,
    ROOT,
    WRITES,
    Command,
    collect,
    gpus_needed,
    parsable,
    runnable,
    subcommand,
)

BIN = Path(sys.executable).parent
COMMANDS, BLOCKS = collect()
SEQPAR = [c for c in COMMANDS if c.program == "seqpar"]
RAY_JOB = [c for c in COMMANDS if c.program == "ray"]


def _gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _params(commands: list[Command], modes: tuple[str, ...]) -> list:
    """One test per command of these modes, skipped ones with their reason (`run` takes the
    skipped lines and the GPU lines, which run where their GPUs are)."""
    params = []
    for cmd in commands:
        if cmd.mode in modes or (cmd.mode in ("skip", "gpu") and "run" in modes):
            marks = [pytest.mark.slow] if cmd.mode == "slow" else []
            if cmd.mode == "skip" or (cmd.mode == "gpu" and
                                      _gpus() < gpus_needed(subcommand(cmd.argv)[2])):
                marks.append(pytest.mark.skip(reason=f"{cmd.page}:{cmd.line}: {cmd.reason}"))
            params.append(pytest.param(cmd, id=cmd.id, marks=marks))
    return params


def _inert(command):
    """A copy of a click command (or group) whose callbacks do nothing: parsing alone."""
    clone = copy.copy(command)
    clone.callback = lambda *args, **kwargs: None
    if isinstance(getattr(command, "commands", None), dict):  # a group (`seqpar cluster`)
        clone.commands = {name: _inert(sub) for name, sub in command.commands.items()}
    return clone


def parse_only(argv: list[str]) -> None:
    """Parse `seqpar argv` as the app would (options, types, arguments) and run nothing."""
    root = typer.main.get_command(cli_app.app)
    build = root.get_command
    root.get_command = lambda ctx, name: (None if (cmd := build(ctx, name)) is None
                                          else _inert(cmd))
    root.main(args=argv, prog_name="seqpar", standalone_mode=False)


def test_the_manual_shows_commands_and_every_seqpar_line_parses():
    """Cheap and complete: an option renamed or removed in the CLI fails here, for every line
    the pages show (the slow and the skipped ones too)."""
    pages = {c.page for c in COMMANDS}
    assert "README.md" in pages and len(SEQPAR) >= 20, sorted(pages)
    failures = []
    for cmd in SEQPAR:
        try:
            parse_only(parsable(cmd))
        except Exception as err:  # click's UsageError and friends: the message says what
            failures.append(f"{cmd.page}:{cmd.line}: `{cmd.text}`: {err}")
    assert not failures, "\n".join(failures)


def seqpar(argv: list[str], monkeypatch, capsys) -> tuple[int, str]:
    """`seqpar argv` as a user runs it, in this process (no interpreter or import to pay)."""
    monkeypatch.setattr(sys, "argv", ["seqpar", *argv])
    with pytest.raises(SystemExit) as info:
        cli_app.main()
    out = capsys.readouterr()
    return info.value.code or 0, out.out + out.err


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    """A user's shell: a fresh working directory (pages write report.html there), no store or
    cluster from this environment."""
    monkeypatch.chdir(tmp_path)
    for name in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def _ran(cmd: Command, argv: list[str], code: int, out: str) -> None:
    print(f"ran {cmd.page}:{cmd.line}: seqpar {' '.join(argv)} -> exit {code}")
    assert code == 0, f"{cmd.page}:{cmd.line}: `{cmd.text}` exited {code}:\n{out[-3000:]}"


_ran_in: dict[tuple[str, int], Path] = {}  # (page, line) -> where that line ran this session


@pytest.mark.parametrize("cmd", _params(SEQPAR, ("run",)))
def test_command_runs(cmd, workdir, monkeypatch, capsys):
    for first in _before(cmd):  # the lines that write the files it reads, in this directory:
        there = _ran_in.get((first.page, first.line))
        if there is not None:  # ran already (its own test): what it wrote
            for name in _writes(first):
                shutil.copy(there / name, workdir / name)
            continue
        argv = runnable(first, scratch=workdir)
        _ran(first, argv, *seqpar(argv, monkeypatch, capsys))
    argv = runnable(cmd, scratch=workdir)
    _ran(cmd, argv, *seqpar(argv, monkeypatch, capsys))
    _ran_in[(cmd.page, cmd.line)] = workdir


def _before(cmd: Command) -> list[Command]:
    """The lines `cmd` needs run first (`Command.before`, theirs before them), in order."""
    return [c for first in cmd.before for c in (*_before(first), first)]


def _writes(cmd: Command) -> list[str]:
    return [cmd.argv[i + 1] for i, a in enumerate(cmd.argv[:-1]) if a in WRITES]


@pytest.mark.parametrize("cmd", _params(SEQPAR, ("store",)))
def test_command_runs_on_the_quickstart_store(cmd, quickstart, workdir, monkeypatch, capsys):
    assert quickstart.returncode == 0, quickstart.stderr[-2000:]

    argv = runnable(cmd, store=quickstart.uri, sweep_id=quickstart.sweep_id, scratch=workdir)
    code, out = seqpar(argv, monkeypatch, capsys)
    _ran(cmd, argv, code, out)
    _, name, args = subcommand(argv)
    if name == "report":
        page = workdir / (args[args.index("-o") + 1] if "-o" in args else "report.html")
        assert page.stat().st_size > 10_000, page


@pytest.mark.parametrize("cmd", _params(SEQPAR, ("gang",)))
def test_check_plans_its_cases(cmd, workdir, monkeypatch, capsys):
    """make test: `seqpar check` as shown up to its ranks (options, masks, every case planned and
    validated); the ranks' run is make test-full's (below) and tests/cli/test_cli_check.py's."""
    from seqpar.workers import checking

    planned: list = []
    monkeypatch.setattr(checking, "check_cases", lambda cases, *a, **k: planned.extend(cases) or [])
    monkeypatch.setattr(checking, "check_steps", lambda cases, *a, **k: planned.extend(cases) or [])
    monkeypatch.setattr(checking, "check_models",  # check --model: its cases and its steps
                        lambda fixed, steps, *a, **k: planned.extend([*fixed, *steps]) or [])
    argv = runnable(cmd, scratch=workdir)
    _ran(cmd, argv, *seqpar(argv, monkeypatch, capsys))
    assert planned, f"{cmd.text}: no case planned"


@pytest.fixture
def session_gang(gang, monkeypatch):
    """`seqpar check` on the session's gang instead of a gang of its own (the same ranks
    without their start-up; tests/cli/test_cli_check.py does the same)."""
    from seqpar.platform import localgang

    monkeypatch.setattr(localgang, "LocalGang", lambda *a, **k: contextlib.nullcontext(gang))


@pytest.mark.slow
@pytest.mark.multirank
@pytest.mark.parametrize("cmd", _params(SEQPAR, ("gang",)))
def test_check_runs_on_the_session_gang(cmd, session_gang, workdir, monkeypatch, capsys):
    argv = runnable(cmd, scratch=workdir)
    _ran(cmd, argv, *seqpar(argv, monkeypatch, capsys))


@pytest.mark.ray
@pytest.mark.parametrize("cmd", _params(SEQPAR, ("slow",)))
def test_long_command_runs(cmd, ray_head, workdir):
    """In a process of its own (it may start or join a Ray), as a user's shell runs it."""
    _, name, _ = subcommand(cmd.argv)
    argv = runnable(cmd, address=ray_head["gcs"] if name == "cluster" else None, scratch=workdir)
    proc = subprocess.run([str(BIN / "seqpar"), *argv], cwd=workdir, env=_env(),
                          capture_output=True, text=True, timeout=600)
    _ran(cmd, argv, proc.returncode, proc.stdout + proc.stderr)
    if name == "calibrate":
        assert (workdir / "local.yaml").exists()  # never the packaged cluster file


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI", "RAY_AUTH_MODE")}


def _ray_job_argv(cmd: Command, head: dict, store: str, job: str | None) -> list[str]:
    """A `ray job` line with the test's head, store and submission id; its seqpar entrypoint
    a dry run by the venv's seqpar (a job's driver finds it on the head's PATH)."""
    argv = [a.replace("http://<head>:8265", head["dashboard"]) for a in cmd.argv]
    if job is not None:
        argv = [job if a == "<submission_id>" else a for a in argv]
    if "--" in argv:
        cut = argv.index("--") + 1
        entry = argv[cut:]
        if Path(entry[0]).name == "seqpar":
            inner = Command(cmd.page, cmd.line, cmd.text, entry[1:])
            argv = [*argv[:cut], str(BIN / "seqpar"),
                    *runnable(inner, store=store, absolute=False)]
    return [str(BIN / "ray"), *argv]


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.skipif(not RAY_JOB, reason="the pages show no `ray job` line")
def test_ray_job_lines_run_against_a_local_head(ray_head, tmp_path, record_property):
    """The pages' `ray job submit`, then `logs` and `status` of that submission, in order."""
    from seqpar.platform import dashboard

    record_property("commands", len(RAY_JOB))
    store, job, seen = f"sqlite:///{tmp_path}/mlflow.db", None, []
    env = _env()
    if dashboard.read_token():  # the head turned token authentication on: as docs/ray.md says
        env["RAY_AUTH_MODE"] = "token"
    for cmd in RAY_JOB:
        argv = _ray_job_argv(cmd, ray_head, store, job)
        assert job is not None or argv[2] == "submit", f"{cmd.id}: no job submitted before it"
        for _ in range(5):  # the head's job agent registers a moment after the node is up
            proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                                  timeout=600)
            if "No available agent to submit job" not in proc.stderr:
                break
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, f"{cmd.page}:{cmd.line}: `{cmd.text}`:\n{out[-3000:]}"
        found = re.search(r"Job '(\S+)' submitted successfully", out)
        job = found.group(1) if found else job
        seen.append(out)
    assert "SUCCEEDED" in seen[-1] or "succeeded" in seen[-1], seen[-1][-2000:]


@pytest.mark.parametrize("block", [pytest.param(b, id=b.id) for b in BLOCKS if not b.slow])
def test_python_block_runs(block, workdir, capsys):
    """A ```python run block, in this process (its imports are the suite's), in a namespace and
    a working directory of its own."""
    exec(compile(block.code, f"{block.page}:{block.line}", "exec"), {"__name__": "__main__"})
    print(f"ran {block.page}:{block.line} (python):\n{capsys.readouterr().out[-1500:]}")


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.parametrize("block", [pytest.param(b, id=b.id) for b in BLOCKS if b.slow])
def test_slow_python_block_runs(block, workdir):
    """A ```python run slow block (one that starts Ray, say), in a fresh interpreter."""
    env = {**_env(), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", block.code], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=600)
    print(f"ran {block.page}:{block.line} (python):\n{proc.stdout[-1500:]}")
    assert proc.returncode == 0, f"{block.page}:{block.line}:\n{proc.stderr[-3000:]}"


def test_the_rules_of_the_test_hold_on_their_own_examples():
    """The collector's rules on lines like the pages' (so a page's layout cannot hide one)."""
    from tests.docs.collect import _split as _split_of
    from tests.docs.collect import classify, fenced_blocks, logical_lines

    body = ["seqpar plan --cluster h100-sxm \\", "    --world 8   # a comment", "ray start --head"]
    assert list(logical_lines(body, 10)) == [
        (10, "seqpar plan --cluster h100-sxm      --world 8   # a comment"),
        (12, "ray start --head")]
    blocks = list(fenced_blocks("x\n```python run slow\nprint(1)\n```\n```\nseqpar studies\n```\n"))
    assert blocks == [("python run slow", 3, ["print(1)"]), ("", 6, ["seqpar studies"])]
    cases = {"seqpar --address auto sweep examples/quickstart.yaml": "run",
             "seqpar report @SWEEP@ -o q.html": "store", "seqpar check -P 2": "gang",
             "seqpar check --bench": "slow", "seqpar sweep <file>": "skip",
             "seqpar check --device cuda": "gpu", "seqpar cluster status": "slow"}
    for text, mode in cases.items():
        cmd = Command("x.md", 1, text, text.split()[1:])
        classify(cmd)
        assert cmd.mode == mode, (text, cmd.mode)
    sweep = Command("x.md", 1, "", ["--address", "auto", "sweep", "examples/quickstart.yaml"])
    assert runnable(sweep) == ["sweep", str(ROOT / "examples/quickstart.yaml"), "--dry-run"]
    report = Command("x.md", 1, "", ["report", "@SWEEP@"])
    assert runnable(report, store="sqlite:///s.db", sweep_id="abc") == [
        "--tracking-uri", "sqlite:///s.db", "report", "abc"]
    assert parsable(Command("x.md", 1, "", ["sweep", "<a_b>", "@SWEEP@"])) == ["sweep", "x", "0" * 32]
    assert _split_of("seqpar report <sweep id> -o x.html") == [
        "seqpar", "report", "@SWEEP@", "-o", "x.html"]
    # a line reading a file an earlier line of its block writes (--save) runs after that line
    pairs = [(c, b) for c in COMMANDS for b in c.before]
    assert any(c.page == "docs/planner.md" for c, _ in pairs), "the plan file form is shown"
    for c, b in pairs:
        assert b.argv[b.argv.index("--save") + 1] in c.argv and b.line < c.line, (c.id, b.id)


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings (lower case, punctuation dropped, spaces to -)."""
    heads = re.findall(r"^#+\s+(.*)$", page.read_text(), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def test_the_pages_links_resolve():
    """Every relative link of README.md, docs/ and benchmarks/README.md names a file that is
    there and, with #anchor, a heading of it (a page split or a heading renamed breaks none)."""
    broken = []
    for page in (*PAGES, ROOT / "benchmarks" / "README.md"):
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if target.startswith(("http://", "https://")):
                continue
            path, _, anchor = target.partition("#")
            where = (page.parent / path).resolve() if path else page
            if not where.exists() or (anchor and where.suffix == ".md"
                                      and anchor not in _anchors(where)):
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, "\n".join(broken)


def test_benchmarks_readme_names_every_script():
    """benchmarks/README.md says what each script measures: a new script gets its row."""
    listed = set(re.findall(r"^\| `(\w+\.py)` \|", (ROOT / "benchmarks" / "README.md").read_text(),
                            flags=re.M))
    scripts = {p.name for p in (ROOT / "benchmarks").glob("*.py")}
    assert scripts <= listed, f"not in benchmarks/README.md: {sorted(scripts - listed)}"
    assert listed <= scripts, f"no such script: {sorted(listed - scripts)}"
