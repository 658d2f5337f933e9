"""A user's corpus read with their tokenizer: documents streamed from Parquet, JSON Lines, Arrow, CSV,
text files or a dataset saved with `datasets.save_to_disk` (`sources`), tokenized in batches with
Hugging Face `tokenizers` (`tokenize`), summarised as the papers do (`summary`), cached by the
corpus's and tokenizer's digests (`cache`) and drawn (`plot`). docs/lengths.md is the manual.

    lengths = cache.lengths_of(CorpusRef("shards/", "tokenizer.json"))  # tokenized once, then read
    print(summary.summarize(lengths).lines())

pyarrow, tokenizers and matplotlib load when first used; `rules` (no seqpar import) only parses the
`corpus:` form, and reads the lengths file `cache.lengths_file` hands it."""
