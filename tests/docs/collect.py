"""The commands and runnable Python blocks of README.md and docs/*.md, and what the docs test does
with each (docs/development.md, "The manual's commands are tests", says the same for authors)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
SEQPAR_PREFIXES = ("seqpar", ".venv/bin/seqpar")
RAY_PREFIXES = ("ray", ".venv/bin/ray")
ROOT_OPTIONS = ("--address", "--tracking-uri")  # the app's own: `seqpar --address X sweep ...`
# placeholders the test fills: a finished sweep's id (the session's quickstart sweep)
SWEEP_PLACEHOLDERS = ("<sweep_id>", "SWEEP_ID")  # (a placeholder's spaces read as _)
SWEEP = "@SWEEP@"
# placeholders a `ray job` line may hold: the test's own head, store and submission
RAY_PLACEHOLDERS = ("<head>", "<mlflow_host>", "<submission_id>")
PLACEHOLDER = re.compile(r"<[^>]+>|\.\.\.")  # <head>, examples/...
WRITES = ("--save",)  # a flag whose file a later line of the same block reads: that line runs after


@dataclass
class Command:
    page: str        # README.md or docs/x.md
    line: int        # where the command starts (1-based)
    text: str        # as the page shows it, continuations joined
    argv: list[str] = field(default_factory=list)  # after the program (seqpar or ray)
    program: str = "seqpar"  # or "ray"
    mode: str = "run"        # run | store | gang | slow | gpu | skip
    reason: str = ""         # why slow or skipped
    also: list[str] = field(default_factory=list)  # the same command elsewhere: page:line
    before: list[Command] = field(default_factory=list)  # the lines of its block that write a
    # file it reads (`seqpar plan --save plan.yaml`, then `seqpar plan plan.yaml`), run first

    @property
    def id(self) -> str:
        again = f" (+{len(self.also)})" if self.also else ""
        return f"{self.page}:{self.line}{again} {self.program} {' '.join(self.argv)}"[:140]


@dataclass
class PyBlock:
    page: str
    line: int
    code: str
    slow: bool

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def fenced_blocks(text: str):
    """(info string, first line number of the body, body lines) of every fenced block."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opened = re.match(r"^\s*(```+|~~~+)\s*(.*)$", lines[i])
        if not opened:
            i += 1
            continue
        fence, info, body, start = opened.group(1), opened.group(2).strip(), [], i + 2
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        yield info, start, body
        i += 1


def logical_lines(body: list[str], start: int):
    """(line number, text) with `\\` continuations joined."""
    pending, first = "", start
    for n, raw in enumerate(body, start):
        if not pending:
            first = n
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        yield first, pending + raw
        pending = ""
    if pending:
        yield first, pending


def _split(text: str) -> list[str] | None:
    text = re.sub(r"<[^>]+>", lambda m: m.group(0).replace(" ", "_"), text)  # one word each
    for name in SWEEP_PLACEHOLDERS:
        text = text.replace(name, SWEEP)
    try:
        return shlex.split(text, comments=True)
    except ValueError:
        return None


def collect() -> tuple[list[Command], list[PyBlock]]:
    commands: list[Command] = []
    blocks: list[PyBlock] = []
    for path in PAGES:
        page = str(path.relative_to(ROOT))
        for info, start, body in fenced_blocks(path.read_text()):
            words = info.split()
            if words[:1] == ["python"]:
                if "run" in words[1:]:
                    blocks.append(PyBlock(page, start, "\n".join(body), "slow" in words[2:]))
                continue
            written: dict[str, Command] = {}  # files the block's lines write (WRITES)
            for line, text in logical_lines(body, start):
                first = text.split(maxsplit=1)[:1]
                if first and first[0] in SEQPAR_PREFIXES + RAY_PREFIXES:
                    argv = _split(text)
                    if argv is None:
                        continue
                    program = "seqpar" if argv[0] in SEQPAR_PREFIXES else "ray"
                    if program == "ray" and argv[1:2] != ["job"]:
                        continue  # `ray start` / `ray stop` set a machine up: not run
                    cmd = Command(page, line, " ".join(text.split()), argv[1:], program)
                    classify(cmd)
                    cmd.before = [w for name, w in written.items() if name in cmd.argv]
                    commands.append(cmd)
                    written.update({argv[i + 1]: cmd for i, a in enumerate(argv[:-1])
                                    if a in WRITES})
    return _once(commands), blocks


def _once(commands: list[Command]) -> list[Command]:
    """A command shown on several pages runs once (its first place; the others in `also`)."""
    first: dict[tuple[str, ...], Command] = {}
    for cmd in commands:
        key = (cmd.program, *cmd.argv)
        if key in first:
            first[key].also.append(f"{cmd.page}:{cmd.line}")
        else:
            first[key] = cmd
    return list(first.values())


def subcommand(argv: list[str]) -> tuple[dict[str, str], str, list[str]]:
    """The root options, the command's name and its arguments."""
    roots, i = {}, 0
    while i < len(argv) and argv[i].startswith("--"):
        name, _, value = argv[i].partition("=")
        if name not in ROOT_OPTIONS:
            break
        if not value:
            i += 1
            value = argv[i] if i < len(argv) else ""
        roots[name] = value
        i += 1
    return roots, (argv[i] if i < len(argv) else ""), argv[i + 1:]


def classify(cmd: Command) -> None:
    """What the test does with a command: `run` it in-process as it is (after the rewrites of
    `runnable`), against the quickstart's `store`, on the session's `gang`, only in make test-full
    (`slow`), only where the GPUs it needs are (`gpu`), or `skip` it (parsed only), with the
    reason."""
    text = " ".join(cmd.argv)  # comments dropped
    if cmd.program == "ray":
        others = [p for p in PLACEHOLDER.findall(text) if p not in RAY_PLACEHOLDERS]
        cmd.mode, cmd.reason = (("skip", f"placeholder {others[0]}") if others else
                                ("slow", "a Ray job against a local head"))
        return
    placeholders = PLACEHOLDER.findall(text)
    if placeholders:
        cmd.mode, cmd.reason = "skip", f"placeholder {placeholders[0]}"
        return
    roots, name, args = subcommand(cmd.argv)
    if re.search(r"--device[= ]cuda", " ".join(args)):
        cmd.mode, cmd.reason = "gpu", f"needs {gpus_needed(args)} CUDA GPU(s) (--device cuda)"
    elif name in ("compare", "report") or (name == "plan" and "--validate" in args):
        cmd.mode = "store"
    elif name in ("sweep", "run", "tune"):
        cmd.mode = "run"  # with --dry-run (a --resume id is not looked up then)
    elif name == "check":
        cmd.mode, cmd.reason = (("slow", "check --bench takes minutes") if "--bench" in args
                                else ("gang", ""))
    elif name == "calibrate":
        cmd.mode, cmd.reason = "slow", "calibrate measures this machine for minutes"
    elif name == "cluster":
        cmd.mode, cmd.reason = "slow", "needs a running Ray cluster (a local head)"


def gpus_needed(args: list[str]) -> int:
    """The GPUs a `--device cuda` line asks for: its --world / -P (check's default 4), else 1."""
    for flag in ("--world", "-P"):
        if flag in args[:-1]:
            return int(args[args.index(flag) + 1])
    return 1


def runnable(cmd: Command, *, store: str | None = None, sweep_id: str | None = None,
             address: str | None = None, scratch: Path | None = None,
             absolute: bool = True) -> list[str]:
    """The argv the test runs: sweeps with --dry-run; the quickstart's store and sweep id for
    `--tracking-uri` and SWEEP_ID; a local head for `--address`; calibrate writes to `scratch`;
    paths of the repository made `absolute` (the test runs in a temporary directory)."""
    roots, name, args = subcommand([a.replace(SWEEP, sweep_id or "0" * 32) for a in cmd.argv])
    if store is not None:
        roots["--tracking-uri"] = store
    if address is not None:
        roots["--address"] = address
    elif name in ("sweep", "run", "tune"):
        roots.pop("--address", None)  # a dry run joins nothing
    if name in ("sweep", "run", "tune") and "--dry-run" not in args:
        args = [*args, "--dry-run"]
    if name == "calibrate" and "--out" not in args and scratch is not None:
        args = [*args, "--out", str(scratch / "local.yaml")]
    args = [str(ROOT / a) if absolute and ("/" in a or a.endswith((".yaml", ".json")))
            and (ROOT / a).exists() else a for a in args]
    return [*(x for k, v in roots.items() for x in (k, v)), name, *args]


def parsable(cmd: Command) -> list[str]:
    """The argv with every placeholder filled by a dummy value: what the CLI parses."""
    return [PLACEHOLDER.sub("x", a).replace(SWEEP, "0" * 32) for a in cmd.argv]
