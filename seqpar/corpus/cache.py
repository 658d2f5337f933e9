"""Tokenized corpora on disk, keyed by the corpus's digest, the tokenizer's, the column and the
limit, so a second run reads instead of tokenizing (`$SEQPAR_CACHE_DIR`, else
`$XDG_CACHE_HOME/seqpar/corpus`, else `~/.cache/seqpar/corpus`). Per key:

    KEY.lengths    one token count a line, in corpus order (what `file:PATH` reads)
    KEY.json       where it came from and its summary (`Summary.profile`): MLflow's dataset input
    KEY.ids        (training only) every document's ids end to end, uint32

Each file is written beside its final name and renamed into place: an interrupted or failed run
leaves nothing half-written.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from seqpar.corpus import summary
from seqpar.corpus.sources import Source, open_source
from seqpar.corpus.tokenize import Progress, Tokenizer, encode, load_tokenizer
from seqpar.errors import ConfigError
from seqpar.rules.lengths import CorpusRef

VERSION = 1  # of the files' meaning: bump to tokenize again


def cache_dir() -> Path:
    if os.environ.get("SEQPAR_CACHE_DIR"):
        return Path(os.environ["SEQPAR_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "seqpar" / "corpus"


@dataclass(frozen=True)
class Corpus:
    """A corpus reference opened: its source and tokenizer checked, its cache key known."""

    ref: CorpusRef
    source: Source
    tokenizer: Tokenizer
    key: str
    digest: str  # the corpus's (Source.digest)

    @property
    def paths(self) -> dict[str, Path]:
        root = cache_dir()
        return {kind: root / f"{self.key}.{kind}" for kind in ("lengths", "json", "ids")}

    def meta(self) -> dict[str, Any]:
        """What the tokenizing pass recorded (the summary, the digests, the vocabulary)."""
        return json.loads(self.paths["json"].read_text())


def open_corpus(ref: CorpusRef, field: str = "corpus", *, tokenizer_field: str | None = None,
                column_field: str | None = None) -> Corpus:
    """`ref` checked (the source, its column, the tokenizer) and keyed; one ConfigError line for
    each problem, naming `field` (or the tokenizer's, the column's own field)."""
    source = open_source(ref.source, ref.column, field, column_field or f"{field}.column")
    tok = load_tokenizer(ref.tokenizer, tokenizer_field or f"{field}.tokenizer")
    digest = source.digest()
    blob = f"{VERSION}|{digest}|{tok.digest}|{ref.column}|{ref.limit}"
    return Corpus(ref, source, tok, hashlib.sha256(blob.encode()).hexdigest()[:20], digest)


def _atomic(path: Path, write: Callable[[Any], None], mode: str = "w") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, mode) as fh:
            write(fh)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def tokenize(corpus: Corpus, *, ids: bool = False,
             on_chunk: Callable[[Progress], None] | None = None) -> None:
    """Tokenize the corpus into its cache files (lengths and meta; with `ids`, the ids too)."""
    paths = corpus.paths
    seen: list[Progress] = []

    def track(p: Progress) -> None:
        seen[:] = [p]
        if on_chunk is not None:
            on_chunk(p)

    ids_tmp = None
    try:
        if ids:
            paths["ids"].parent.mkdir(parents=True, exist_ok=True)
            fd, ids_tmp = tempfile.mkstemp(prefix=paths["ids"].name + ".", suffix=".part",
                                           dir=paths["ids"].parent)
            with os.fdopen(fd, "wb") as fh:
                lengths = encode(corpus.source, corpus.tokenizer, limit=corpus.ref.limit,
                                 ids_out=fh, on_chunk=track)
        else:
            lengths = encode(corpus.source, corpus.tokenizer, limit=corpus.ref.limit,
                             on_chunk=track)
        if not lengths:
            raise ConfigError(corpus.source.field, corpus.ref.source,
                              f"holds no document (no non-empty text in column "
                              f"{corpus.ref.column!r})")
        _atomic(paths["lengths"], lambda fh: fh.write("\n".join(map(str, lengths)) + "\n"))
        if ids_tmp is not None:
            os.replace(ids_tmp, paths["ids"])
            ids_tmp = None
    finally:
        if ids_tmp is not None:
            Path(ids_tmp).unlink(missing_ok=True)
    p = seen[0] if seen else Progress()
    meta = {"name": corpus.source.name, "source": str(Path(corpus.ref.source).resolve()),
            "form": "corpus:" + corpus.ref.body, "corpus_digest": corpus.digest,
            "tokenizer": corpus.tokenizer.path, "tokenizer_digest": corpus.tokenizer.digest,
            "column": corpus.ref.column, "limit": corpus.ref.limit, "key": corpus.key,
            "vocab": corpus.tokenizer.vocab, "empty_documents": p.empty,
            "seconds": p.seconds, "summary": summary.summarize(np.frombuffer(
                lengths, dtype=np.uint32)).profile()}
    _atomic(paths["json"], lambda fh: json.dump(meta, fh, indent=1))


def cached(corpus: Corpus, ids: bool = False) -> bool:
    """Whether the cache holds the corpus's lengths (and, with `ids`, its ids)."""
    paths = corpus.paths
    return all(paths[k].is_file() for k in ("lengths", "json", *(("ids",) if ids else ())))


def ensure(corpus: Corpus, *, ids: bool = False,
           on_chunk: Callable[[Progress], None] | None = None) -> bool:
    """The cache files there (tokenizing when not); True when they were there already."""
    if cached(corpus, ids):
        return True
    tokenize(corpus, ids=ids, on_chunk=on_chunk)
    return False


def lengths_file(ref: CorpusRef, field: str = "lengths") -> str:
    """The file of `ref`'s tokenized lengths, tokenized now unless cached: what `rules.lengths.
    parse(corpus=)` reads."""
    corpus = open_corpus(ref, field)  # its tokenizer and column blamed as FIELD.tokenizer, .column
    ensure(corpus)
    return str(corpus.paths["lengths"])


def read_lengths(path: str | Path) -> np.ndarray:
    return np.loadtxt(path, dtype=np.int64, ndmin=1)


def dataset_input(corpus: Corpus) -> dict[str, Any]:
    """The corpus as an MLflow dataset input (`platform.tracking.Tracker.log_datasets`): name,
    digest (of the corpus and the tokenizer: the same text tokenized otherwise is another
    dataset), source, and the length summary as its profile."""
    meta = corpus.meta()
    profile = {**meta["summary"], "tokenizer": meta["tokenizer"], "column": meta["column"],
               "vocab": meta["vocab"]}
    return {"name": meta["name"], "digest": corpus.key[:16], "source": meta["source"],
            "profile": profile}
