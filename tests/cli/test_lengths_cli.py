"""`seqpar lengths` as a user runs it: the summary, the lengths it writes (what file:PATH reads, in
corpus order) and its figure; a second run reads the cache; `seqpar plan --lengths corpus:...`
plans from the same lengths; every bad input one line, exit 2, nothing written."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest

from tests import corpora
from tests.cli.test_cli_check import seqpar


@pytest.fixture
def built(tmp_path, monkeypatch):
    monkeypatch.setenv("SEQPAR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    tok = corpora.word_tokenizer(tmp_path / "tokenizer.json")
    want = [7, 300, 41, 5, 1200, 64, 9, 77]
    folder = tmp_path / "shards"
    folder.mkdir()
    docs = corpora.documents(want, 5)
    corpora.write(docs[:5], folder / "part-0.parquet", "parquet")
    corpora.write(docs[5:], folder / "part-1.parquet", "parquet")
    return folder, tok, want


def test_lengths_prints_the_summary_writes_the_lengths_and_the_figure(built, tmp_path,
                                                                      monkeypatch, capsys):
    folder, tok, want = built
    before = os.umask(0o022)
    try:
        code, out, err = seqpar(monkeypatch, capsys, "lengths", str(folder), "--tokenizer",
                                str(tok), "--out", "lengths.txt", "--plot", "lengths.png")
    finally:
        os.umask(before)
    assert code == 0, err
    assert (tmp_path / "lengths.txt").read_text().split() == [str(n) for n in want]
    assert (tmp_path / "lengths.png").read_bytes()[:4] == b"\x89PNG"
    for name in ("lengths.txt", "lengths.png"):  # as any new file: others may read it
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644, name
    assert "documents 8" in out and "tokens 1,703" in out and "as a workload" in out
    assert "docs" in err  # the progress bar
    code, out, _ = seqpar(monkeypatch, capsys, "lengths", str(folder), "--tokenizer", str(tok),
                          "--json", "--limit", "5")
    got = json.loads(out)
    assert code == 0 and got["documents"] == 5 and got["max"] == 1200
    assert got["p90"] == np.percentile(want[:5], 90)
    code, out, _ = seqpar(monkeypatch, capsys, "lengths", str(folder), "--tokenizer", str(tok),
                          "--json", "--limit", "5")
    assert json.loads(out)["cached"] is True


def test_a_plan_draws_from_the_corpus(built, monkeypatch, capsys):
    folder, tok, want = built
    code, out, err = seqpar(monkeypatch, capsys, "plan", "--scope", "cluster", "--world", "4",
                            "--seq-len", "2048", "--lengths", f"corpus:{folder}?tokenizer={tok}",
                            "--json", "--top", "2")
    assert code == 0, err
    assert json.loads(out)["lengths"] == f"corpus:{folder}?tokenizer={tok}&column=text"


@pytest.mark.parametrize("tokenizer", ["gpt2", "meta-llama/Llama-3.1-8B"])
def test_a_tokenizer_given_by_name_is_refused_as_the_tokenizer(built, monkeypatch, capsys,
                                                               tokenizer):
    """In `--lengths corpus:...?tokenizer=NAME` the error names the tokenizer, with the line that
    saves it, whether a plan or a sweep reads it."""
    folder, _, _ = built
    code, _, err = seqpar(monkeypatch, capsys, "plan", "--scope", "cluster", "--world", "4",
                          "--seq-len", "2048", "--lengths", f"corpus:{folder}?tokenizer={tokenizer}")
    assert code == 2 and err.startswith(f"error: lengths.tokenizer={tokenizer!r}: is not a local "
                                        "path: nothing is downloaded"), err
    assert f"Tokenizer.from_pretrained({tokenizer!r}).save('tokenizer.json')" in err
    sweep = {"name": "corpus", "base": {"model": "tiny", "env": {"device": "cpu"},
                                        "plan": {"world": 2, "sp_policy": "dynamic"},
                                        "train": {"model": "tiny"},
                                        "workload": {"seq_len": 2048, "tokens_per_step": 4096,
                                                     "lengths": f"corpus:{folder}?tokenizer="
                                                                f"{tokenizer}"}}}
    Path("corpus.yaml").write_text(json.dumps(sweep))
    code, _, err = seqpar(monkeypatch, capsys, "sweep", "corpus.yaml", "--dry-run")
    assert code == 2 and err.startswith(
        f"error: workload.lengths.tokenizer={tokenizer!r}: is not a local path"), err


@pytest.mark.parametrize(("args", "line"), [
    (["--limit", "0"], "error: limit=0: must be a positive number of documents"),
    (["--column", "id"], "error: column='id': must hold text"),
    (["--column", "body"], "error: column='body': is not a column of part-0.parquet"),
    (["--tokenizer", "meta-llama/Llama-3.1-8B"], "error: tokenizer='meta-llama/Llama-3.1-8B': is "
                                                 "not a local path: nothing is downloaded"),
    (["--plot", "lengths.gif"], "error: plot='lengths.gif': must end in .png, .svg or .pdf"),
])
def test_bad_input_is_one_line_and_writes_nothing(built, tmp_path, monkeypatch, capsys, args,
                                                  line):
    folder, tok, _ = built
    full = ["lengths", str(folder), "--tokenizer", str(tok), "--out", "lengths.txt", *args]
    code, out, err = seqpar(monkeypatch, capsys, *full)
    lines = [x for x in err.splitlines() if x.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith(line), err
    assert not (tmp_path / "lengths.txt").exists()
    assert not list(tmp_path.glob("**/*.part"))
