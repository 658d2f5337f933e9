"""How fast `seqpar plan` answers and what it holds: wall and CPU seconds and peak memory (max RSS)
of the command as a user runs it, median of --repeats runs, with the host's load; and whether torch
was imported (`python -X importtime`).

As a user runs it: an installed package's modules are compiled to bytecode once (pip does it at
install, Python on the first run), so each case runs once unmeasured with a bytecode cache (a
temporary PYTHONPYCACHEPREFIX, whatever PYTHONDONTWRITEBYTECODE says). --compile measures runs
that compile every module each time instead (no bytecode cache: PYTHONDONTWRITEBYTECODE=1).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/plan_speed.py [--repeats 3] [--compile]

Before and after: `--tree DIR` (repeatable) runs each case from each tree's `seqpar` package
(PYTHONPATH=DIR, a `git worktree` of the other commit, each with its own bytecode cache),
interleaved: each repeat runs every tree in turn, so a load that comes and goes falls on both.
A host shared with other work inflates wall and CPU seconds alike: quote the load beside them.

    git worktree add /tmp/before <commit>
    .venv/bin/python benchmarks/plan_speed.py --repeats 5 --tree /tmp/before --tree $PWD

`--instructions` adds each case's instructions executed, once per tree under valgrind's callgrind
(about a minute a run): a count the host's load does not move, where wall and CPU seconds on a
shared host vary by half from one minute to the next.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SEQPAR = str(Path(sys.executable).with_name("seqpar"))
CASES = {
    "attention scope, P = 1,024, 4M tokens":
        ["plan", "--cluster", "loongtrain-a100", "--model", "llama2-7b", "--seq-len", "4194304",
         "--world", "1024", "--nodes", "128", "--top", "5"],
    "cluster scope, G = 1,024 (128 nodes), Llama-3.1-8B, 256K tokens, 16M a step":
        ["plan", "--scope", "cluster", "--cluster", "h100-sxm", "--model", "llama3.1-8b",
         "--seq-len", "262144", "--world", "1024", "--nodes", "128", "--tokens-per-step",
         str(64 * 262144), "--top", "5"],
    "cluster scope with lengths, G = 1,024 (256 nodes of 4), the 12-layer model, lognormal "
    "1024/1.5 in 128-8192, capacity 2,048, 8M tokens a step":
        ["plan", "--scope", "cluster", "--cluster", "h100-sxm", "--model",
         str(Path(__file__).with_name("plan_lengths_model.yaml")), "--world", "1024", "--nodes",
         "256", "--seq-len", "8192", "--lengths", "lognormal:mean=1024,sigma=1.5,min=128,max=8192",
         "--capacity", "2048", "--tokens-per-step", str(4 * 1024 * 2048), "--top", "5"],
    "cluster scope, G = 64 (8 nodes), Llama-3.1-8B, 256K tokens, 2M a step":
        ["plan", "--scope", "cluster", "--cluster", "h100-sxm", "--model", "llama3.1-8b",
         "--seq-len", "262144", "--world", "64", "--nodes", "8", "--tokens-per-step",
         str(8 * 262144), "--top", "5"],
}


def environment(cache: str | None, tree: str | None = None) -> dict[str, str]:
    """The command's environment: bytecode cached in `cache`, or (None) compiled every run; the
    `seqpar` package of `tree` (None: the installed one)."""
    env = {**os.environ, "COLUMNS": "120"}
    if tree is not None:
        env["PYTHONPATH"] = tree
    if cache is None:
        return {**env, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return {**env, "PYTHONPYCACHEPREFIX": cache}


def run(args: list[str], env: dict[str, str]) -> tuple[float, float, float]:
    """(wall s, CPU s of the child, its max RSS in MB)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([SEQPAR, *args], check=True, capture_output=True, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, after.ru_maxrss / 1024


def instructions(args: list[str], env: dict[str, str]) -> int:
    """Instructions the command executes (valgrind's callgrind: its total `I refs`)."""
    out = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
                          sys.executable, SEQPAR, *args], capture_output=True, text=True,
                         check=True, env=env)
    return int(re.findall(r"refs:\s*([\d,]+)", out.stderr)[-1].replace(",", ""))


def imports_torch(args: list[str], env: dict[str, str]) -> bool:
    out = subprocess.run([sys.executable, "-X", "importtime", SEQPAR, *args], capture_output=True,
                         text=True, check=True, env=env)
    return any(line.rstrip().endswith(" torch") for line in out.stderr.splitlines())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--compile", action="store_true",
                    help="compile every module each run (no bytecode cache)")
    ap.add_argument("--tree", action="append", default=None, metavar="DIR",
                    help="a source tree whose seqpar to run (repeatable: the trees interleaved)")
    ap.add_argument("--case", action="append", type=int, default=None, metavar="K",
                    help=f"only the K-th case, 1 to {len(CASES)} (repeatable; default: all)")
    ap.add_argument("--instructions", action="store_true",
                    help="also each case's instructions, once per tree under valgrind (callgrind)")
    a = ap.parse_args()
    if a.instructions and shutil.which("valgrind") is None:
        ap.error("--instructions needs valgrind on the PATH")
    cases = {name: args for k, (name, args) in enumerate(CASES.items(), 1)
             if a.case is None or k in a.case}
    trees: list[str | None] = a.tree or [None]
    with tempfile.TemporaryDirectory(prefix="plan_speed_pycache_") as cache:
        envs = [environment(None if a.compile else os.path.join(cache, str(k)), tree)
                for k, tree in enumerate(trees)]
        print(f"load average before: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores); "
              + ("every module compiled each run" if a.compile else "bytecode cached"))
        for name, args in cases.items():
            if not a.compile:
                for env in envs:
                    run(args, env)  # compiles what this case imports, as a first run does
            load = os.getloadavg()[0]
            runs: list[list[tuple[float, float, float]]] = [[] for _ in trees]
            for _ in range(a.repeats):
                for k, env in enumerate(envs):
                    runs[k].append(run(args, env))
            load = (load + os.getloadavg()[0]) / 2
            for tree, env, got in zip(trees, envs, runs, strict=True):
                wall, cpu = (statistics.median(r[i] for r in got) for i in (0, 1))
                rss = max(r[2] for r in got)
                where = f" [{tree}]" if tree is not None else ""
                counted = (f", {instructions(args, env) / 1e9:.2f} G instructions"
                            if a.instructions else "")
                print(f"{name}{where}: wall {wall:.2f} s, CPU {cpu:.2f} s (median of {a.repeats}"
                      f"{', interleaved' if len(trees) > 1 else ''}; load {load:.1f}), max RSS "
                      f"{rss:.0f} MB{counted}, imports torch: {imports_torch(args, env)}")
        print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
