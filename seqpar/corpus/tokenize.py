"""A corpus through the user's tokenizer: Hugging Face `tokenizers`, batched (`encode_batch_fast`,
the library's own threads, no offsets), no special tokens added (a document's length is its own
tokens'). Reading the next chunk overlaps the encoding of this one (a reader thread: pyarrow and
the tokenizer both release the GIL).

    tok = load_tokenizer("model_dir/")             # or a tokenizer.json
    lengths = count(open_source("shards/"), tok)   # one length a document, in corpus order
"""

from __future__ import annotations

import hashlib
import queue
import threading
import time
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from seqpar.corpus.sources import Source
from seqpar.errors import ConfigError, require

CHUNK_BYTES = 1 << 20  # text a batch encodes at once (its encodings are ~30x its bytes)
SAVE_HINT = ("nothing is downloaded: save it locally first, e.g. tokenizers.Tokenizer."
             "from_pretrained({name!r}).save('tokenizer.json'), and give that file")


@dataclass(frozen=True)
class Tokenizer:
    """A loaded `tokenizers.Tokenizer`, the file it came from and that file's digest."""

    path: str
    digest: str
    inner: Any

    @property
    def vocab(self) -> int:
        """The vocabulary the model needs: every id the tokenizer gives (added tokens too)."""
        return int(self.inner.get_vocab_size(with_added_tokens=True))

    @property
    def name(self) -> str:
        p = Path(self.path)
        return p.parent.name if p.name == "tokenizer.json" else p.stem


def load_tokenizer(path: str, field: str = "tokenizer") -> Tokenizer:
    """The tokenizer of a tokenizer.json or of a local folder holding one (a Hugging Face model
    folder); a name that is not a local path is refused in one line (nothing is downloaded)."""
    require(isinstance(path, str) and bool(path), field, path, "needs a tokenizer.json or a folder "
                                                               "holding one")
    p = Path(path).expanduser()
    if not p.exists():
        raise ConfigError(field, path, "is not a local path: " + SAVE_HINT.format(name=path))
    if p.is_dir():
        require((p / "tokenizer.json").is_file(), field, path,
                "the folder holds no tokenizer.json (a Hugging Face tokenizer saved with "
                "save_pretrained has one)")
        p = p / "tokenizer.json"
    from tokenizers import Tokenizer as HfTokenizer

    blob = p.read_bytes()
    try:
        inner = HfTokenizer.from_str(blob.decode("utf-8"))
    except Exception as err:  # the library's message says what it could not parse
        raise ConfigError(field, path, "cannot be loaded by tokenizers: "
                                       + " ".join(str(err).split())[:200]) from None
    return Tokenizer(str(p.resolve()), hashlib.sha256(blob).hexdigest()[:16], inner)


@dataclass
class Progress:
    """What a pass has read so far (the progress bar's fields)."""

    documents: int = 0
    tokens: int = 0
    empty: int = 0  # documents of no token (dropped: no sequence)
    bytes: int = 0
    seconds: float = 0.0


def _prefetched(chunks: Iterator[list[str]], depth: int = 2) -> Iterator[list[str]]:
    """`chunks`, read ahead by a thread (at most `depth` chunks waiting: memory stays bounded)."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    done = object()
    stop = threading.Event()

    def fill() -> None:
        try:
            for c in chunks:
                while not stop.is_set():
                    try:
                        q.put(c, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(done)
        except BaseException as err:  # handed to the consumer, raised there
            q.put(err)

    thread = threading.Thread(target=fill, name="corpus-reader", daemon=True)
    thread.start()
    try:
        while True:
            item = q.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()


def encode(source: Source, tok: Tokenizer, *, limit: int | None = None,
           chunk_bytes: int = CHUNK_BYTES, ids_out: BinaryIO | None = None,
           on_chunk: Callable[[Progress], None] | None = None) -> array:
    """Each document's token count, in corpus order (the first `limit` documents; a document of
    no token is dropped), as an array('I'); with `ids_out`, every document's ids end to end as
    uint32 in the machine's order."""
    require(limit is None or (isinstance(limit, int) and limit >= 1), "limit", limit,
            "must be a positive number of documents (or none: the whole corpus)")
    lengths = array("I")
    seen = Progress()
    t0 = time.perf_counter()
    for texts in _prefetched(source.chunks(chunk_bytes)):
        if limit is not None and seen.documents + len(texts) > limit:
            texts = texts[:limit - seen.documents]
        encodings = tok.inner.encode_batch_fast(texts, add_special_tokens=False)
        counts = [len(e) for e in encodings]
        if ids_out is not None:
            for e in encodings:
                if len(e):
                    ids_out.write(array("I", e.ids).tobytes())
        lengths.extend(c for c in counts if c)
        seen.empty += counts.count(0)
        seen.documents += len(texts)
        seen.tokens += sum(counts)
        seen.bytes += sum(len(t) for t in texts)
        seen.seconds = time.perf_counter() - t0
        if on_chunk is not None:
            on_chunk(seen)
        if limit is not None and seen.documents >= limit:
            break
    return lengths
