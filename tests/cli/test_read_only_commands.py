"""Commands that only read never write: `seqpar compare` and `seqpar report` on a store that is not
there, or on an id the store does not hold, answer in one line (exit 2) and leave no store, no lock
and no change behind."""

from __future__ import annotations

import hashlib
import secrets
import sys
from pathlib import Path

import pytest

from seqpar.cli import app as cli_app


def seqpar(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["seqpar", *args])
    with pytest.raises(SystemExit) as info:
        cli_app.main()
    out = capsys.readouterr()
    return info.value.code, out.out + out.err


def files(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("args", [["compare"], ["compare", "--sweep", "{id}"], ["report", "{id}"],
                                  ["compare", "--study", "throughput"]])
def test_no_store_there_is_one_line_and_nothing_made(monkeypatch, capsys, tmp_path, args):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    some_id = secrets.token_hex(16)
    for uri in ([], ["--tracking-uri", f"sqlite:///{tmp_path}/elsewhere/mlflow.db"]):
        code, out = seqpar(monkeypatch, capsys, *uri, *(a.format(id=some_id) for a in args))
        assert code == 2 and out.count("\n") == 1 and "holds no MLflow store" in out, out
    assert list(tmp_path.iterdir()) == []  # no mlflow.db, no lock, no report.html


@pytest.mark.parametrize(("args", "field"), [(["compare", "--sweep", "{id}"], "--sweep"),
                                             (["report", "{id}"], "sweep_id")])
def test_an_id_the_store_does_not_hold_changes_nothing(monkeypatch, capsys, tmp_path, fresh_store,
                                                       args, field):
    root = Path(fresh_store.removeprefix("sqlite:///")).parent
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    before = files(root)
    some_id = secrets.token_hex(16)
    code, out = seqpar(monkeypatch, capsys, "--tracking-uri", fresh_store,
                       *(a.format(id=some_id) for a in args))
    assert code == 2 and out.count("\n") == 1, out
    assert f"{field}='{some_id}': no sweep with this id" in out
    assert files(root) == before and list(work.iterdir()) == []  # no lock, no page
