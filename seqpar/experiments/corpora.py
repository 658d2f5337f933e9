"""A training trial on a user's corpus: its token ids made on the driver (seqpar.corpus.cache,
once per corpus and tokenizer), the case pointed at them with the tokenizer's vocabulary, and the
corpus as the MLflow dataset input of the trial's run.

    case, lengths = train_on(case, CorpusRef("shards/", "tok.json"), "workload.data.corpus")
"""

from __future__ import annotations

import dataclasses
from typing import Any

from seqpar.case import TrainCase
from seqpar.corpus import cache
from seqpar.rules.lengths import CorpusRef, corpus_ref


def _open(ref: CorpusRef, field: str) -> cache.Corpus:
    if field.startswith("workload.data"):
        return cache.open_corpus(ref, "workload.data.corpus",
                                 tokenizer_field="workload.data.tokenizer",
                                 column_field="workload.data.column")
    return cache.open_corpus(ref, field, tokenizer_field=field, column_field=field)


def train_on(case: TrainCase, ref: CorpusRef, field: str) -> tuple[TrainCase, str]:
    """`case` training on `ref`'s token ids (tokenized now unless cached) and the file of its
    lengths; the model's vocabulary is the tokenizer's unless the case overrides it (the case
    checks that an override holds every id)."""
    corpus = _open(ref, field)
    cache.ensure(corpus, ids=True)
    vocab = corpus.tokenizer.vocab
    overrides = dict(case.model_overrides)
    overrides.setdefault("vocab", vocab)
    return (dataclasses.replace(case, corpus=str(corpus.paths["ids"]), corpus_vocab=vocab,
                                model_overrides=tuple(overrides.items())),
            str(corpus.paths["lengths"]))


def dataset_inputs(workload: Any) -> list[dict[str, Any]]:
    """The corpora a spec's workload reads (`workload.data.corpus`, `corpus:` lengths), as MLflow
    dataset inputs (`cache.dataset_input`): already tokenized when the spec was validated."""
    refs: list[tuple[CorpusRef, str]] = []
    data = getattr(workload, "data", None)
    if data is not None and hasattr(data, "ref"):
        refs.append((data.ref, "workload.data.corpus"))
    lengths = getattr(workload, "lengths", None) or ""
    if lengths.startswith("corpus:"):
        ref = corpus_ref(lengths, "workload.lengths")
        if all(ref != r for r, _ in refs):
            refs.append((ref, "workload.lengths"))
    out = []
    for ref, field in refs:
        corpus = _open(ref, field)
        cache.ensure(corpus)
        out.append(cache.dataset_input(corpus))
    return out
