"""The commands that need neither Ray nor MLflow: help, studies, dry runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from seqpar.cli.app import app

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ["studies", "run", "sweep", "compare", "tune", "check"]


def invoke(*args: str):
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command):
    assert "Usage" in invoke(command, "--help")


def test_global_options_are_documented():
    text = invoke("--help")
    assert "--address" in text and "--tracking-uri" in text and "mlflow.db" in text


def test_studies_lists_every_study_with_its_headline():
    rows = json.loads(invoke("studies", "--json"))
    names = {r["study"] for r in rows}
    assert {"throughput", "placement", "burst-backward", "wallfacer-c"} <= names
    assert all(r["headline"] and int(r["trials"].split("/")[0]) > 0 for r in rows)


def test_sweep_dry_run_lists_the_quickstart_trials(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = invoke("sweep", str(ROOT / "examples" / "quickstart.yaml"), "--dry-run")
    assert "8 trial(s)" in out and "ring P=2 zigzag causal N=4096" in out
    assert list(tmp_path.iterdir()) == []  # a dry run writes nothing


def test_run_study_dry_run_with_set_overrides(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = invoke("run", "load-balance", "--set", "workload.seq_len=512", "--dry-run")
    assert "6 trial(s)" in out and "N=512" in out and "contiguous" in out


def test_tune_dry_run_shows_the_tuning_space():
    out = invoke("tune", "-P", "4", "--seq-len", "1024", "--dry-run")
    assert "tuning space" in out and "ring" in out and "ulysses" in out
