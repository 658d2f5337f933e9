"""A user's corpus through their tokenizer (seqpar.corpus): exact lengths in every format it reads,
the summary equal to numpy's, the cache keyed by digests (a second read does not tokenize), the
`corpus:` lengths form, and every bad input in one line naming the field, the value and the rule,
with nothing half-written. Tokenizers and corpora are built here; nothing is fetched."""

from __future__ import annotations

import random

import numpy as np
import pytest

from seqpar.corpus import cache, summary
from seqpar.corpus import tokenize as tokenize_mod
from seqpar.corpus.sources import open_source
from seqpar.corpus.tokenize import load_tokenizer
from seqpar.errors import ConfigError
from seqpar.rules import lengths as L
from tests import corpora

FORMATS = ("parquet", "jsonl", "json", "arrow", "arrow-stream", "csv", "txt")
SUFFIX = {"arrow-stream": "arrow"}


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SEQPAR_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def word_tok(tmp_path_factory):
    return str(corpora.word_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json"))


def counts(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.choice([1, 2, 3, rng.randint(4, 60), rng.randint(60, 400)]) for _ in range(n)]


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_gives_exactly_the_documents_word_counts(tmp_path, word_tok, fmt, seed):
    want = counts(40, seed)
    path = corpora.write(corpora.documents(want, seed), tmp_path / f"c.{SUFFIX.get(fmt, fmt)}", fmt)
    got = L.parse(f"corpus:{path}?tokenizer={word_tok}", corpus=cache.lengths_file)
    assert got.sample() == tuple(want)  # in corpus order
    assert got.spec == f"corpus:{path}?tokenizer={word_tok}&column=text"


def test_a_folder_and_a_saved_dataset_are_read_in_order(tmp_path, word_tok, seed):
    want = counts(30, seed)
    docs = corpora.documents(want, seed)
    folder = tmp_path / "shards"
    folder.mkdir()
    corpora.write(docs[:10], folder / "a.parquet", "parquet")
    corpora.write(docs[10:20], folder / "b.jsonl", "jsonl")
    corpora.write(docs[20:], folder / "c.parquet", "parquet")
    (folder / "README.md").write_text("not a shard")
    ds = corpora.saved_dataset(docs, tmp_path / "saved", shards=3)
    for source in (folder, ds):
        lengths = cache.read_lengths(cache.lengths_file(L.CorpusRef(str(source), word_tok)))
        assert lengths.tolist() == want


def test_the_summary_is_numpys_on_the_lengths():
    rng = np.random.default_rng(random.randrange(1000))
    x = np.round(np.exp(rng.normal(8, 2, 5000))).astype(np.int64) + 1
    s = summary.summarize(x)
    assert (s.documents, s.tokens, s.max) == (x.size, x.sum(), x.max())
    assert s.mean == pytest.approx(x.mean())
    assert (s.p50, s.p90, s.p99) == tuple(np.percentile(x, (50, 90, 99)))
    work = x * (x + 1) / 2
    for t in summary.THRESHOLDS:
        assert s.token_share[t] == pytest.approx(x[x > t].sum() / x.sum())
        assert s.work_share[t] == pytest.approx(work[x > t].sum() / work.sum())


def test_a_second_read_comes_from_the_cache_and_an_edit_tokenizes_again(tmp_path, word_tok,
                                                                        monkeypatch):
    path = corpora.write(corpora.documents([3, 4, 5]), tmp_path / "c.jsonl", "jsonl")
    ref = L.CorpusRef(str(path), word_tok)
    first = cache.lengths_file(ref)
    calls = []
    real = tokenize_mod.encode
    monkeypatch.setattr(cache, "encode", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert cache.lengths_file(ref) == first and calls == []
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "c.jsonl").write_bytes(path.read_bytes())  # the same bytes elsewhere: the same key
    assert cache.lengths_file(L.CorpusRef(str(copy / "c.jsonl"), word_tok)) == first
    corpora.write(corpora.documents([3, 4, 6]), path, "jsonl")
    assert cache.read_lengths(cache.lengths_file(ref)).tolist() == [3, 4, 6] and calls == [1]


def test_limit_reads_the_first_documents_and_bpe_lengths_are_its_encodings(tmp_path):
    tok = corpora.bpe_tokenizer(tmp_path / "bpe.json")
    docs = corpora.documents(counts(25, 1), 1)
    path = corpora.write(docs, tmp_path / "c.parquet", "parquet")
    got = L.parse(f"corpus:{path}?tokenizer={tok}&limit=9", corpus=cache.lengths_file)
    inner = load_tokenizer(str(tok)).inner
    assert got.sample() == tuple(len(inner.encode(d, add_special_tokens=False)) for d in docs[:9])


def test_training_ids_are_the_documents_encodings_end_to_end(tmp_path):
    tok = corpora.bpe_tokenizer(tmp_path / "bpe.json")
    docs = corpora.documents([5, 9, 2, 30], 3)
    corpus = cache.open_corpus(L.CorpusRef(str(corpora.write(docs, tmp_path / "c.txt", "txt")),
                                           str(tok)))
    cache.ensure(corpus, ids=True)
    ids = np.fromfile(corpus.paths["ids"], dtype=np.uint32).tolist()
    inner = load_tokenizer(str(tok)).inner
    assert ids == [i for d in docs for i in inner.encode(d, add_special_tokens=False).ids]
    assert corpus.meta()["vocab"] == inner.get_vocab_size(with_added_tokens=True)


def bad(fn, field: str, value: str, rule: str) -> None:
    with pytest.raises(ConfigError) as info:
        fn()
    assert (info.value.field, str(info.value.value)) == (field, value), str(info.value)
    assert rule in info.value.rule and "\n" not in str(info.value), str(info.value)


def test_bad_input_is_one_line_naming_field_value_and_rule(tmp_path, word_tok):
    good = corpora.write(corpora.documents([2, 3]), tmp_path / "c.parquet", "parquet")

    def ref(source: str, tok: str = word_tok, column: str = "text") -> object:
        return lambda: cache.lengths_file(L.CorpusRef(source, tok, column), "lengths")

    bad(ref(str(tmp_path / "nope.parquet")), "lengths", str(tmp_path / "nope.parquet"),
        "no file or folder")
    bad(ref("allenai/c4"), "lengths", "allenai/c4", "is not a local path: nothing is downloaded")
    (tmp_path / "c.xlsx").write_text("x")
    bad(ref(str(tmp_path / "c.xlsx")), "lengths", str(tmp_path / "c.xlsx"), "must be a .parquet")
    bad(ref(str(good), column="body"), "lengths.column", "body", "is not a column of c.parquet")
    bad(ref(str(good), column="id"), "lengths.column", "id",
        "must hold text; in c.parquet it holds int64")
    empty = corpora.write(["", " "], tmp_path / "e.jsonl", "jsonl")
    bad(ref(str(empty)), "lengths", str(empty), "holds no document")
    latin = tmp_path / "l.txt"
    latin.write_bytes("caf\u00e9 au lait".encode("latin-1"))
    bad(ref(str(latin)), "lengths", str(latin), "is not UTF-8")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    bad(ref(str(good), tok=str(broken)), "lengths.tokenizer", str(broken),
        "cannot be loaded by tokenizers")
    bad(ref(str(good), tok="gpt2"), "lengths.tokenizer", "gpt2", "is not a local path")
    bad(lambda: L.parse(f"corpus:{good}?column=text"), "lengths", f"corpus:{good}?column=text",
        "needs its tokenizer")
    bad(lambda: L.parse(f"corpus:{good}?tokenizer={word_tok}&limit=0"), "lengths",
        f"corpus:{good}?tokenizer={word_tok}&limit=0", "must be a positive number")
    bad(lambda: L.parse(f"corpus:{good}?tokenizer={word_tok}"), "lengths",
        f"corpus:{good}?tokenizer={word_tok}", "tokenized by seqpar.corpus")
    assert not list((tmp_path / "cache").glob("*.part"))  # nothing half-written
    bad(lambda: tokenize_mod.encode(open_source(str(good)), load_tokenizer(word_tok), limit=0),
        "limit", "0", "must be a positive number")
