"""Training on a user's corpus: `workload.data: {corpus, tokenizer, column}` packs its token ids into
sequences of seq_len (the model's vocabulary the tokenizer's), and `corpus:` lengths train each
sequence on its document's own ids, the SP step equal to the one-process model; a spec's bad
combinations are one line. Tokenizer and corpus are built here."""

from __future__ import annotations

import numpy as np
import pytest

from seqpar.errors import ConfigError
from seqpar.experiments.spec import ExperimentSpec
from seqpar.experiments.steps import make_case
from seqpar.workers import step_check
from seqpar.workers.measure.train import batch_tokens, train_steps
from tests import corpora

MODEL = {"heads": 4, "kv_heads": 2, "head_dim": 16}  # the tiny decoder's attention shape


@pytest.fixture
def corpus(tmp_path, monkeypatch):
    monkeypatch.setenv("SEQPAR_CACHE_DIR", str(tmp_path / "cache"))
    tok = corpora.bpe_tokenizer(tmp_path / "tokenizer.json", vocab_size=300)
    docs = corpora.documents([12, 30, 5, 18, 44, 9, 25, 3], seed=2)
    return str(corpora.write(docs, tmp_path / "c.parquet", "parquet")), str(tok), docs


def spec(workload: dict, train: dict | None = None) -> ExperimentSpec:
    return ExperimentSpec.parse({
        "model": MODEL, "plan": {"algorithm": "local", "world": 1, "layout": "contiguous"},
        "workload": {"seq_len": 32, "dtype": "float64", "warmup": 0, "iters": 2, **workload},
        "train": {"model": "tiny", **(train or {})}})


def test_corpus_data_packs_its_token_ids_and_trains(corpus):
    source, tok, docs = corpus
    case = spec({"data": {"corpus": source, "tokenizer": tok}}).to_case()
    from tokenizers import Tokenizer

    inner = Tokenizer.from_file(tok)
    encoded = [inner.encode(d, add_special_tokens=False).ids for d in docs]
    stream = [i for ids in encoded for i in ids]
    starts = np.cumsum([0] + [len(ids) for ids in encoded[:-1]])
    assert case.config().vocab == inner.get_vocab_size(with_added_tokens=True)
    boundaries = 0
    for step in range(4):
        tokens, cu = batch_tokens(case, step, 0)
        start = (step * 32) % (len(stream) - 32)
        assert tokens[0].tolist() == stream[start:start + 33]
        assert cu == (0, *(int(s) - start for s in starts if start < s < start + 32), 32)
        boundaries += len(cu) - 2
    assert boundaries > 0  # windows hold documents' boundaries
    out = train_steps(case, 0, None)
    assert len(out.steps) == 2 and all(np.isfinite(out.losses))


@pytest.mark.multirank
def test_corpus_lengths_train_each_document_on_its_ids_as_one_process_does(gang, corpus):
    source, tok, _ = corpus
    case = make_case("ring", 2, f"corpus:{source}?tokenizer={tok}", tokens=64, capacity=32,
                     policy="dynamic", overrides=(("heads", 4), ("kv_heads", 2), ("hidden", 32),
                                                  ("ffn", 48)), longest=64)
    assert case.corpus is not None and case.lengths.startswith("file:")
    got = step_check.compare(case, gang.run(step_check.rank_run, case), step_check.reference(case))
    assert got.ok, got.failures


def test_bad_corpus_specs_are_one_line(corpus):
    source, tok, _ = corpus
    data = {"corpus": source, "tokenizer": tok}
    cases = [({"data": {**data, "column": "id"}}, None, "workload.data.column", "must hold text"),
             ({"data": {**data, "tokenizer": "gpt2"}}, None, "workload.data.tokenizer",
              "is not a local path"),
             ({"data": data}, {"vocab": 100}, "train.vocab", "must hold the tokenizer's vocabulary"),
             ({"data": data, "lengths": "fixed:16"}, None, "workload.lengths",
              "with a corpus as data, the sequences are its documents")]
    for workload, train, field, rule in cases:
        with pytest.raises(ConfigError) as info:
            spec(workload, train)
        assert info.value.field == field and rule in info.value.rule, str(info.value)
        assert "\n" not in str(info.value)
