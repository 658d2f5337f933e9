"""`seqpar plan` run in-process, for the plan tests: its JSON, or its table at 120 columns."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from seqpar.cli import display
from seqpar.cli.app import app


def plan_json(*args: str) -> dict:
    """`seqpar plan ARGS --json`, parsed (the command must succeed)."""
    result = CliRunner().invoke(app, ["plan", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def plan_table(monkeypatch: pytest.MonkeyPatch, *args: str) -> str:
    """`seqpar plan ARGS`'s table as a 120-column terminal shows it."""
    monkeypatch.setattr(display.console, "width", 120)
    result = CliRunner().invoke(app, ["plan", *args])
    assert result.exit_code == 0, result.output
    return result.output
