"""What a newcomer sees first: `seqpar compare`'s table on a quickstart-shaped sweep fits the terminal
without wrapping a cell (120 columns; in 80 only algorithm names may fold), with what is the same in
every row in the title, the step and its interval in one cell, flags as marks with a one-line
legend, and the link to MLflow's compare-runs view of the sweep's trials."""

from __future__ import annotations

import json
import os
import random
import re
import sys
import urllib.parse
from pathlib import Path

import pytest
from typer.testing import CliRunner

from seqpar.cli import display
from seqpar.cli.app import app
from seqpar.platform.tracking import Tracker
from seqpar.sweeps.report.plots.common import trial_label
from seqpar.sweeps.report.table import three
from seqpar.sweeps.report.view import trials

ALGORITHMS = (("local", 1), ("allgather", 2), ("ulysses", 2), ("ring", 2))


def _log_quickstart(tracker: Tracker, rng: random.Random, oversubscribed: str = "") -> str:
    """A sweep of the quickstart's shape (4 algorithms x 2 lengths) with drawn numbers."""
    sweep = tracker.start_sweep("quickstart", "quickstart", {},
                                {"seqpar.headline": "tokens_per_s", "seqpar.sweep": "quickstart"})
    for algorithm, world in ALGORITHMS:
        for n in (2048, 4096):
            step = rng.uniform(5, 1500)
            tags = {"seqpar.device": "cpu", "seqpar.topology": "virtual",
                    "seqpar.cpu_count": "1" if algorithm == oversubscribed else "2"}
            if algorithm == "ring" and n == 4096:
                tags["seqpar.unstable"] = "interval ±31% (of the median, > 10%, 3 iterations)"
            tracker.log_trial(
                sweep, name=f"{algorithm} P={world} zigzag causal N={n}", spec_hash=f"{algorithm}{n}",
                params={"plan.algorithm": algorithm, "plan.world": world, "plan.nodes": 1,
                        "plan.layout": "zigzag", "workload.seq_len": n, "model.heads": 8,
                        "model.kv_heads": 8, "workload.dtype": "float32",
                        "workload.causal": True},
                metrics={"step_ms": step, "step_ms_ci_low": step * 0.97,
                         "step_ms_ci_high": step * 1.04, "tokens_per_s": n / step * 1e3,
                         "peak_mem_bytes": rng.uniform(1, 900) * 2**20,
                         "bytes_total": 0.0 if world == 1 else rng.uniform(1e5, 9e7),
                         "load_imbalance": rng.uniform(1, 1.3)},
                tags=tags, status="FINISHED", cause=None, detail={})
    tracker.end_sweep(sweep)
    return sweep


@pytest.fixture
def sweep(fresh_store) -> tuple[str, str, Tracker]:
    tracker = Tracker(fresh_store)
    return fresh_store, _log_quickstart(tracker, random.Random()), tracker


def _compare(monkeypatch, uri: str, width: int, *args: str) -> str:
    monkeypatch.setattr(display.console, "width", width)  # what COLUMNS=width gives the console
    result = CliRunner().invoke(app, ["--tracking-uri", uri, "compare", *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_the_console_takes_its_width_from_columns(monkeypatch):
    monkeypatch.setenv("COLUMNS", "87")
    assert display._width(object()) == 87


@pytest.mark.parametrize("width", [120, 80])
def test_compare_fits_the_terminal_without_wrapping_a_number(monkeypatch, sweep, width):
    uri, sweep_id, tracker = sweep
    out = _compare(monkeypatch, uri, width)
    lines = out.splitlines()
    link = ("compare in MLflow: ", "  (serve it first")  # a link is one line, however long
    assert max(len(line) for line in lines if not line.startswith(link)) <= width, out
    runs = tracker.trials(sweep_id)
    for run in runs:  # every number whole, on the line of its trial
        tps = f"{run.metrics['tokens_per_s']:,.0f}"
        step = f"{three(run.metrics['step_ms'])} ({three(run.metrics['step_ms_ci_low'])}-"
        assert any(tps in line and step in line for line in lines), (tps, step, out)
    assert "layout zigzag" in out and "H/Hkv 8/8" in out  # the same in every row: the title
    header = next(i for i, line in enumerate(lines) if "step ms (95% CI)" in line)
    rows = [line for line in lines[header + 2:] if line.strip() and not line.startswith(
        ("flags:", "U ", "compare in MLflow", "  (serve"))]
    if width == 120:  # one line a trial, each length's best first and starred
        assert len(rows) == len(runs), out
        assert [rows[0].split()[2], rows[4].split()[2]] == ["2048", "4096"], out
        assert [i for i, row in enumerate(rows) if "*" in row] == [0, 4], out
        assert re.search(r"^flags: \* best by tokens_per_s at its N; ", out, re.M), out
    assert re.search(r"^flags: .*U unstable", out, re.M)
    assert re.search(r"^U ring P=2 N=4096: interval ±31%", out, re.M)


def test_flags_are_marks_explained_once(monkeypatch, fresh_store):
    tracker = Tracker(fresh_store)
    _log_quickstart(tracker, random.Random(), oversubscribed="ulysses")
    out = _compare(monkeypatch, fresh_store, 120)
    legend = [line for line in out.splitlines() if line.startswith("flags:")]
    assert len(legend) == 1 and "O oversubscribed" in legend[0] and "U unstable" in legend[0]
    rows = json.loads(_compare(monkeypatch, fresh_store, 120, "--json"))  # every column in JSON
    assert {r["flags"].strip("*") for r in rows if r["algorithm"] == "ulysses"} == {"O"}
    assert {r["layout"] for r in rows} == {"zigzag"} and {r["status"] for r in rows} == {"FINISHED"}


def test_compare_links_to_mlflows_compare_runs_view_of_the_trials(monkeypatch, sweep):
    uri, sweep_id, tracker = sweep
    out = _compare(monkeypatch, uri, 120)
    link = re.search(r"compare in MLflow: (\S+)", out).group(1)
    base, fragment = link.split("/#/compare-runs?")
    assert base == "http://127.0.0.1:5000" and f"mlflow ui --backend-store-uri {uri}" in out
    # the mlflow installed beside seqpar, as the README types it (.venv/bin/mlflow in a checkout)
    beside = Path(sys.executable).parent / "mlflow"
    here = os.path.relpath(beside) if beside.is_relative_to(Path.cwd()) else str(beside)
    assert f"(serve it first: {here} ui --backend-store-uri {uri} --workers 1)" in out, out
    query = dict(p.split("=", 1) for p in fragment.split("&"))
    runs = tracker.trials(sweep_id)
    assert sorted(json.loads(urllib.parse.unquote(query["runs"]))) == sorted(
        r.run_id for r in runs)
    assert json.loads(urllib.parse.unquote(query["experiments"])) == [runs[0].experiment_id]


def test_trials_under_any_mask_are_told_apart_by_their_mask(monkeypatch, fresh_store):
    """A sweep over workload.mask (the sparse study's shape): each row names its mask."""
    tracker = Tracker(fresh_store)
    sweep = tracker.start_sweep("sparse", "sparse", {}, {"seqpar.headline": "tokens_per_s"})
    specs = ("full", "causal", "block_sparse:64:0.25:0")
    for i, (spec, layout) in enumerate((s, lay) for s in specs for lay in ("contiguous", "balanced")):
        tracker.log_trial(
            sweep, name=f"burst {spec} {layout}", spec_hash=f"s{i}",
            params={"plan.algorithm": "burst", "plan.world": 2, "plan.nodes": 1,
                    "plan.layout": layout, "workload.seq_len": 2048, "model.heads": 4,
                    "model.kv_heads": 2, "workload.dtype": "float32", "workload.causal": True,
                    "workload.mask": spec},
            metrics={"step_ms": 10.0 + i, "tokens_per_s": 2048 / (10.0 + i) * 1e3},
            tags={"seqpar.device": "cpu", "seqpar.cpu_count": "2"}, status="FINISHED",
            cause=None, detail={})
    tracker.end_sweep(sweep)
    rows = json.loads(_compare(monkeypatch, fresh_store, 120, "--json"))
    assert sorted((r["mask"], r["layout"]) for r in rows) == sorted(
        (s, lay) for s in specs for lay in ("contiguous", "balanced"))
    out = _compare(monkeypatch, fresh_store, 120)
    assert "block_sparse:64:0.25:0" in out and "mask" in out
    views = trials(tracker.trials(sweep))  # the report's plots label each trial apart too
    assert len({trial_label(t) for t in views}) == len(views) == 6
