"""`seqpar plan --save FILE` / `seqpar plan FILE`: the question written down and asked again, the
command line over the file, one line for a bad file; the help's panels, a line a flag."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from typer.testing import CliRunner

from seqpar.cli import display
from seqpar.cli.app import app
from seqpar.cli.plan_file import PANELS, version
from seqpar.errors import ConfigError

LENGTHS = ("--scope", "cluster", "--cluster", "h100-sxm", "--model",
           "benchmarks/plan_lengths_model.yaml", "--world", "8", "--nodes", "2", "--lengths",
           "lognormal:mean=1024,sigma=1.5,min=128,max=8192", "--tokens-per-step", "300000",
           "--capacity", "2048", "--sp-policy", "dynamic", "--top", "4")


def plan(*args: str):
    return CliRunner().invoke(app, ["plan", *args])


@pytest.fixture
def wide(monkeypatch):
    monkeypatch.setattr(display.console, "width", 160)


@pytest.mark.parametrize("question", [
    ("--cluster", "loongtrain-a100", "--seq-len", "65536", "--world", "16", "--option",
     "dhp=4", "--top", "6"),
    LENGTHS,
], ids=["attention", "lengths"])
def test_save_then_the_file_answers_as_the_flags_did(question, tmp_path, wide):
    path = tmp_path / "plan.yaml"
    saved = plan(*question, "--save", str(path))
    assert saved.exit_code == 0, saved.output
    assert f"saved the question to {path}" in saved.stderr
    again = plan(str(path))
    assert again.exit_code == 0, again.output
    assert again.stdout == saved.stdout and " 1 " in again.stdout
    assert plan("--from", str(path)).stdout == saved.stdout
    data = yaml.safe_load(path.read_text())
    assert data["seqpar"] == version()
    assert len(data) == 1 + 32  # the version and every flag of the question, defaults resolved
    assert data["mask"] == "causal" and data["group-sizes"] == "power-of-two"
    assert data["json"] is False and data["max-seq"] is False


def test_the_file_keeps_rules_as_rules_and_the_command_line_wins(tmp_path):
    path = tmp_path / "plan.yaml"
    args = ("--scope", "model", "--cluster", "h100-sxm", "--model", "tiny", "--seq-len", "8192",
            "--world", "8", "--option", "dhp=2", "--json")
    first = plan(*args, "--save", str(path))
    assert first.exit_code == 0, first.output
    text = path.read_text()
    assert "nodes: null  # world / GPUs a node: 1" in text and "option: [dhp=2]" in text
    out = json.loads(plan(str(path), "--world", "16", "--option", "dhp=4").stdout)
    assert out["world"] == 16 and out["nodes"] == 2  # the rule, not the 1 it gave at 8 ranks
    assert {c["options"].get("dhp") for c in out["configs"] if c["algorithm"] == "usp"} == {4}
    table = plan(str(path), "--no-json", "--top", "2")
    assert table.exit_code == 0 and not table.stdout.lstrip().startswith("{")
    assert "tiny N=8,192 P=8" in " ".join(table.stdout.split())


@pytest.mark.parametrize(("text", "starts", "says"), [
    ("seq_len: 4096\n", "seq_len=4096: in ", "no such key (did you mean seq-len?)"),
    ("world: eight\n", "world='eight': in ", "must be an integer"),
    ("world: 8.5\n", "world=8.5: in ", "must be an integer"),
    ("world: null\n", "world=None: in ", "needs a value (leave the key out for the default, 8)"),
    ("json: 1\n", "json=1: in ", "must be true or false"),
    ("option: dhp=2\n", "option='dhp=2': in ", "a list of KEY=VALUE words"),
    ("- 1\n", "plan='", "must map the flags' long names to values"),
    ("world: [\n", "plan='", "is not YAML"),
])
def test_a_bad_file_is_one_line_naming_the_key(text, starts, says, tmp_path):
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    result = plan(str(path))
    assert isinstance(result.exception, ConfigError), result.output
    message = str(result.exception)
    assert message.startswith(starts) and says in message and "\n" not in message, message


def test_a_missing_file_twice_named_or_another_versions_file(tmp_path):
    missing = plan(str(tmp_path / "nope.yaml"))
    assert isinstance(missing.exception, ConfigError)
    assert "no such file" in str(missing.exception)
    path = tmp_path / "plan.yaml"
    path.write_text("seqpar: 0.0.1\nworld: 2\ntop: 1\n")
    twice = plan(str(path), "--from", str(path))
    assert isinstance(twice.exception, ConfigError) and str(twice.exception).startswith("from=")
    older = plan(str(path))
    assert older.exit_code == 0, older.output
    assert "written by seqpar 0.0.1" in older.stderr and "P=2" in older.stdout


def test_help_groups_the_flags_in_panels_one_line_each():
    result = CliRunner().invoke(app, ["plan", "--help"], env={"COLUMNS": "120"})
    assert result.exit_code == 0
    lines = result.output.splitlines()
    panels = [re.sub(r"[╭─╮]", "", line).strip() for line in lines if line.startswith("╭")]
    assert panels[-5:] == [*PANELS, "The question as a file"], panels
    rows = [line.strip("│ ") for line in lines if line.startswith("│")]
    flags = [r for r in rows if r.startswith("-")]
    assert len(flags) == 1 + 32 + 2, flags  # --help, the question's 32, --from, --save
    continued = [r for r in rows if r and not r.startswith(("-", "FILE"))]
    assert not continued, continued  # no flag's help wraps to a second line at 120 columns
