"""`seqpar lengths SOURCE --tokenizer TOK`: a corpus's documents through its tokenizer, streamed,
with a progress bar; the length summary; the lengths (`--out`, the form `file:PATH` reads) and a
figure (`--plot`). The tokenized lengths are cached (seqpar.corpus.cache), so `corpus:` lengths in a
plan or a sweep read them instead of tokenizing again."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from seqpar.cli.display import console, err_console
from seqpar.corpus import cache, summary
from seqpar.corpus import plot as plots
from seqpar.errors import ConfigError, require
from seqpar.rules.lengths import CorpusRef


def lengths(
    source: Annotated[str, typer.Argument(
        help="A .parquet, .jsonl/.json, .arrow, .csv or .txt file, a folder of them, or a folder "
             "datasets.save_to_disk wrote.")],
    tokenizer: Annotated[str, typer.Option(
        "--tokenizer", help="A tokenizer.json or a local folder holding one (a Hugging Face "
                            "model folder). Nothing is downloaded.")],
    column: Annotated[str, typer.Option("--column", help="The column holding the text.")] = "text",
    limit: Annotated[int | None, typer.Option(
        "--limit", help="Read only the first N documents.")] = None,
    out: Annotated[Path | None, typer.Option(
        "--out", help="Write the lengths here, one a line in corpus order (files by name, rows in "
                      "order; documents of no token dropped): what file:PATH reads.")] = None,
    plot: Annotated[Path | None, typer.Option(
        "--plot", help="Draw the distribution here (.png, .svg or .pdf): documents and tokens by "
                       "length, and the attention work.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    fresh: Annotated[bool, typer.Option(
        "--fresh", help="Tokenize again even when the cache holds this corpus.")] = False,
) -> None:
    """Tokenize a corpus with its tokenizer: its length distribution, for plans and sweeps."""
    require(limit is None or limit >= 1, "limit", limit,
            "must be a positive number of documents (omit it to read the whole corpus)")
    for name, path in (("out", out), ("plot", plot)):
        require(path is None or path.parent.is_dir(), name, str(path),
                "its folder must exist (nothing is written until the corpus is read)")
    require(plot is None or plot.suffix.lower() in (".png", ".svg", ".pdf"), "plot", str(plot),
            "must end in .png, .svg or .pdf")
    corpus = cache.open_corpus(CorpusRef(source, tokenizer, column, limit), "SOURCE",
                               tokenizer_field="tokenizer", column_field="column")
    cached = not fresh and cache.cached(corpus)
    if not cached:
        with _Bar(corpus, quiet=as_json) as bar:
            cache.tokenize(corpus, on_chunk=bar.update)
    meta = corpus.meta()
    values = cache.read_lengths(corpus.paths["lengths"])
    s = summary.summarize(values)
    if out is not None:
        _write("out", out, lambda fh: fh.write(corpus.paths["lengths"].read_text()))
    if plot is not None:
        title = (f"{meta['name']} through {corpus.tokenizer.name}: "
                 f"{s.documents:,} documents, {s.tokens:,} tokens")
        _write("plot", plot, lambda fh: plots.save(values, fh, title, plot.suffix[1:]),
               binary=True)
    if as_json:
        print(json.dumps({**s.profile(), "source": meta["source"], "form": meta["form"],
                          "cached": cached, "lengths_file": str(corpus.paths["lengths"]),
                          "seconds": meta["seconds"]}, indent=1))
        return
    rate = (f"{s.tokens / meta['seconds']:,.0f} tokens/s" if meta["seconds"] else "")
    how = "read from the cache" if cached else f"tokenized in {meta['seconds']:.1f} s, {rate}"
    console.print(f"{meta['name']} ({meta['form']}): {how}", highlight=False, soft_wrap=True)
    for line in s.lines():
        console.print("  " + line, highlight=False, soft_wrap=True)
    if meta["empty_documents"]:
        console.print(f"  {meta['empty_documents']:,} documents of no token dropped",
                      highlight=False)
    for what, path in (("lengths", out), ("figure", plot)):
        if path is not None:
            console.print(f"wrote the {what} to {path}", highlight=False)
    console.print(f"as a workload: --lengths 'corpus:{meta['form'].removeprefix('corpus:')}'",
                  highlight=False, soft_wrap=True)


def _write(field: str, path: Path, write, binary: bool = False) -> None:
    """Write beside `path` and rename into place: a failure leaves nothing half-written. The file
    gets the mode any new file gets here (0644 under the usual umask), not the temporary's 0600."""
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=path.suffix, dir=path.parent)
    try:
        with os.fdopen(fd, "wb" if binary else "w") as fh:
            write(fh)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        raise ConfigError(field, str(path),
                          f"cannot be written ({err.strerror})") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    """The process's umask (read by setting it, so set back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class _Bar:
    """The progress bar on stderr: documents, tokens and their rates."""

    def __init__(self, corpus, quiet: bool = False):
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.progress = None if quiet else Progress(
            SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
            TextColumn("{task.fields[docs]:>12,} docs {task.fields[docs_s]:>10,.0f}/s"),
            TextColumn("{task.fields[tokens]:>14,} tokens {task.fields[tokens_s]:>12,.0f}/s"),
            console=err_console, transient=False)
        self.name = corpus.source.name

    def __enter__(self) -> _Bar:
        if self.progress is not None:
            self.progress.__enter__()
            self.task = self.progress.add_task(f"tokenizing {self.name}", docs=0, docs_s=0.0,
                                               tokens=0, tokens_s=0.0)
        return self

    def update(self, p) -> None:
        if self.progress is not None:
            sec = max(p.seconds, 1e-9)
            self.progress.update(self.task, docs=p.documents, docs_s=p.documents / sec,
                                 tokens=p.tokens, tokens_s=p.tokens / sec)

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.__exit__(*exc)

