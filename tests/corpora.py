"""Corpora and tokenizers the tests build themselves (nothing is fetched): a word-level tokenizer
over the shipped text's words, so a document of n words is exactly n tokens, and a corpus of such
documents written in each format seqpar reads."""

from __future__ import annotations

import json
import random
from pathlib import Path

SHIPPED = Path(__file__).resolve().parents[1] / "seqpar/experiments/texts/sequence-parallelism.txt"


def words() -> list[str]:
    return sorted(set(SHIPPED.read_text(encoding="utf-8").split()))


def word_tokenizer(path: Path) -> Path:
    """A word-level tokenizer (whitespace split, [UNK] for a word it does not know) saved as
    `path`: a document of n words is n tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words())}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(path))
    return path


def bpe_tokenizer(path: Path, vocab_size: int = 400) -> Path:
    """A small BPE trained on the shipped text, saved as `path`."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train([str(SHIPPED)], trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["[UNK]"],
                                                 show_progress=False))
    tok.save(str(path))
    return path


def documents(counts: list[int], seed: int = 0) -> list[str]:
    """One document of n shipped words per count (a word may be repeated)."""
    rng = random.Random(seed)
    vocab = words()
    return [" ".join(rng.choice(vocab) for _ in range(n)) for n in counts]


def write(docs: list[str], path: Path, fmt: str, rows_per_group: int = 7) -> Path:
    """`docs` as one file of `fmt` (parquet, jsonl, json, arrow, arrow-stream, csv, txt), with an
    id column beside the text."""
    import pyarrow as pa

    table = pa.table({"id": list(range(len(docs))), "text": docs})
    if fmt == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, path, row_group_size=rows_per_group)
    elif fmt in ("jsonl", "json"):
        path.write_text("".join(json.dumps({"id": i, "text": d}) + "\n" for i, d in enumerate(docs)))
    elif fmt in ("arrow", "arrow-stream"):
        opener = pa.ipc.new_file if fmt == "arrow" else pa.ipc.new_stream
        with opener(str(path), table.schema) as w:
            for b in table.to_batches(max_chunksize=rows_per_group):
                w.write_batch(b)
    elif fmt == "csv":
        import pyarrow.csv as pc

        pc.write_csv(table, path)
    elif fmt == "txt":
        path.write_text("\n\n".join(docs) + "\n")
    return path


def saved_dataset(docs: list[str], folder: Path, shards: int = 2) -> Path:
    """The layout `datasets.Dataset.save_to_disk` writes: arrow stream shards, state.json listing
    them in order, dataset_info.json."""
    folder.mkdir(parents=True)
    per = -(-len(docs) // shards)
    files = []
    for k in range(shards):
        name = f"data-{k:05d}-of-{shards:05d}.arrow"
        write(docs[k * per:(k + 1) * per], folder / name, "arrow-stream")
        files.append({"filename": name})
    (folder / "state.json").write_text(json.dumps({"_data_files": files, "_split": "train"}))
    (folder / "dataset_info.json").write_text(json.dumps({"features": {"text": {
        "dtype": "string", "_type": "Value"}}}))
    return folder
