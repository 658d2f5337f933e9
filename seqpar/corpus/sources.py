"""Where a corpus's documents come from: a file or a folder of .parquet, .jsonl/.json (JSON Lines),
.arrow (IPC file or stream), .csv or .txt files, or a folder `datasets.save_to_disk` wrote. The
documents are read in order (files by name, or in the dataset's own order; rows in file order)
as chunks of texts of about `chunk_bytes`, streamed in record batches: memory holds a chunk and
the reader's current batch, whatever the corpus's size.

    source = open_source("shards/", column="text")
    for texts in source.chunks(1 << 20):
        ...

A .txt file's documents are its parts between blank lines ("\\n\\n"), stripped, empty ones
dropped: what `text:PATH` reads. A null or empty text is no document (dropped).
"""

from __future__ import annotations

import codecs
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqpar.errors import ConfigError, require

FORMATS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".arrow": "arrow",
           ".csv": "csv", ".txt": "txt"}
FORMAT_RULE = ("must be a .parquet, .jsonl/.json (JSON Lines), .arrow, .csv or .txt file, a folder "
               "of them, or a folder datasets.save_to_disk wrote")
SAVE_HINT = ("nothing is downloaded: save it locally first, e.g. "
             "datasets.load_dataset(NAME, split='train').save_to_disk(DIR), and give DIR")
TEXT_SEPARATOR = "\n\n"
ROWS_PER_BATCH = 2048  # rows a reader decodes at a time (a batch is cut to chunk_bytes after)
DIGEST_SAMPLE_BYTES = 1 << 20  # a file's digest reads its size and its first and last MiB


@dataclass(frozen=True)
class Source:
    """A corpus on disk: its files in reading order and the column holding the text."""

    path: str
    files: tuple[Path, ...]
    column: str
    field: str = "corpus"          # what an error about the source names
    column_field: str = "column"   # what an error about the column names

    @property
    def name(self) -> str:
        """What MLflow and the summary call it: the file or folder's name."""
        return Path(self.path).resolve().name

    def digest(self) -> str:
        """16 hex digits over each file's name (relative to the source), size and first and last
        MiB, and the column: the same corpus copied elsewhere keeps it; an edit changes it (an
        edit inside a file that keeps its size and both ends is not seen)."""
        root = Path(self.path)
        h = hashlib.sha256(f"column={self.column}\n".encode())
        for f in self.files:
            size = f.stat().st_size
            rel = f.name if root.is_file() else str(f.relative_to(root))
            h.update(f"{rel}\0{size}\0".encode())
            with f.open("rb") as fh:
                h.update(fh.read(DIGEST_SAMPLE_BYTES))
                if size > 2 * DIGEST_SAMPLE_BYTES:
                    fh.seek(size - DIGEST_SAMPLE_BYTES)
                    h.update(fh.read(DIGEST_SAMPLE_BYTES))
        return h.hexdigest()[:16]

    @property
    def bytes(self) -> int:
        return sum(f.stat().st_size for f in self.files)

    def chunks(self, chunk_bytes: int) -> Iterator[list[str]]:
        """The documents in order, as lists of texts of about `chunk_bytes` (counted in characters;
        a longer document is a chunk of its own)."""
        out: list[str] = []
        held = 0
        for f in self.files:
            for texts in _read(f, self):
                for t in texts:
                    if not t:
                        continue
                    out.append(t)
                    held += len(t)
                    if held >= chunk_bytes:
                        yield out
                        out, held = [], 0
        if out:
            yield out


def open_source(path: str, column: str = "text", field: str = "corpus",
                column_field: str = "column") -> Source:
    """The corpus at `path` with its files listed and its column checked against the first file's
    schema; every problem a ConfigError(field, path, rule) in one line."""
    require(isinstance(path, str) and bool(path), field, path, "needs a path")
    p = Path(path).expanduser()
    if not p.exists():
        looks_named = "/" in path and not path.startswith(("/", ".", "~")) and not p.suffix
        raise ConfigError(field, path, "is not a local path: " + SAVE_HINT if looks_named else
                          f"no file or folder at {p}")
    require(isinstance(column, str) and bool(column), column_field, column,
            "names the column holding the text")
    files = _files(p, field, path)
    require(bool(files), field, path, FORMAT_RULE + " (the folder holds none)")
    source = Source(str(p), files, column, field, column_field)
    for f in files:
        if FORMATS[f.suffix.lower()] != "txt":  # a .txt has no columns
            _check_column(f, source)
            break
    return source


def _files(p: Path, field: str, path: str) -> tuple[Path, ...]:
    if p.is_file():
        require(p.suffix.lower() in FORMATS, field, path, FORMAT_RULE)
        return (p,)
    if (p / "dataset_dict.json").is_file():
        splits = json.loads((p / "dataset_dict.json").read_text()).get("splits", [])
        raise ConfigError(field, path, f"is a DatasetDict of splits {', '.join(splits)}: give one "
                                       f"split's folder, e.g. {p / (splits[0] if splits else 'train')}")
    if (p / "state.json").is_file():  # datasets.save_to_disk: the arrow files in the dataset's order
        state = json.loads((p / "state.json").read_text())
        names = [d["filename"] for d in state.get("_data_files", [])]
        require(bool(names), field, path, "its state.json lists no data file")
        return tuple(p / n for n in names)
    return tuple(sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in FORMATS
                        and not f.name.startswith(".")))


def _check_column(f: Path, source: Source) -> None:
    import pyarrow as pa

    schema = _schema(f, source)
    column = source.column
    require(column in schema.names, source.column_field, column,
            f"is not a column of {f.name} (its columns: {', '.join(schema.names)})")
    kind = schema.field(column).type
    text = (pa.string(), pa.large_string()) + ((pa.string_view(),) if hasattr(pa, "string_view")
                                                else ())
    require(kind in text, source.column_field, column,
            f"must hold text; in {f.name} it holds {kind}")


def _schema(f: Path, source: Source) -> Any:
    fmt = FORMATS[f.suffix.lower()]
    try:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            return pq.read_schema(f)
        if fmt == "arrow":
            return _arrow_reader(f).schema
        reader = _row_reader(f, fmt)
        return reader.schema
    except ConfigError:
        raise
    except Exception as err:  # pyarrow's own message names what is wrong with the file
        raise _unreadable(f, fmt, err, source) from None


def _unreadable(f: Path, fmt: str, err: Exception, source: Source) -> ConfigError:
    msg = " ".join(str(err).split())[:200]
    if isinstance(err, UnicodeDecodeError) or "utf8" in msg.lower() or "utf-8" in msg.lower():
        return ConfigError(source.field, str(f), f"is not UTF-8 text ({msg})")
    hint = " (JSON Lines: one object a line)" if fmt == "json" else ""
    return ConfigError(source.field, str(f), f"cannot be read as {fmt}{hint}: {msg}")


def _row_reader(f: Path, fmt: str) -> Any:
    """A streaming reader of a JSON Lines or CSV file (record batches of ~ROWS_PER_BATCH rows)."""
    if fmt == "json":
        import pyarrow.json as pj

        return pj.open_json(f, read_options=pj.ReadOptions(block_size=1 << 20))
    import pyarrow.csv as pc

    return pc.open_csv(f, read_options=pc.ReadOptions(block_size=1 << 20))


def _arrow_reader(f: Path) -> Any:
    import pyarrow as pa

    mapped = pa.memory_map(str(f))
    try:
        return pa.ipc.open_file(mapped)
    except pa.ArrowInvalid:  # datasets.save_to_disk writes the stream format
        mapped.seek(0)
        return pa.ipc.open_stream(mapped)


def _read(f: Path, source: Source) -> Iterator[list[str | None]]:
    """A file's texts in order, a record batch at a time."""
    fmt = FORMATS[f.suffix.lower()]
    if fmt == "txt":
        yield from _text_documents(f, source)
        return
    column = source.column
    try:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            pf = pq.ParquetFile(f, pre_buffer=False)
            require(column in pf.schema_arrow.names, source.column_field, column,
                    f"is not a column of {f.name}")
            batches: Any = pf.iter_batches(batch_size=ROWS_PER_BATCH, columns=[column])
        elif fmt == "arrow":
            reader = _arrow_reader(f)
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches)) if hasattr(
                reader, "num_record_batches") else reader
        else:
            batches = _row_reader(f, fmt)
        for batch in batches:
            i = batch.schema.get_field_index(column)
            require(i >= 0, source.column_field, column, f"is not a column of {f.name}")
            yield batch.column(i).to_pylist()
    except ConfigError:
        raise
    except Exception as err:
        raise _unreadable(f, fmt, err, source) from None


def _text_documents(f: Path, source: Source, block: int = 1 << 20) -> Iterator[list[str | None]]:
    """A text file's documents (parts between blank lines), read a MiB at a time."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="strict")
    rest = ""
    with f.open("rb") as fh:
        while True:
            raw = fh.read(block)
            try:
                text = rest + decoder.decode(raw, final=not raw)
            except UnicodeDecodeError as err:
                raise ConfigError(source.field, str(f), f"is not UTF-8 text ({err.reason} near "
                                                        f"byte {fh.tell() - len(raw) + err.start})"
                                  ) from None
            parts = text.split(TEXT_SEPARATOR)
            rest = parts.pop() if raw else ""
            yield [s for s in (p.strip() for p in parts) if s]
            if not raw:
                return
