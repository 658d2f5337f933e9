"""Real text for training: bytes as tokens (`TextData`) or a corpus's token ids (`CorpusData`, made
by seqpar.corpus on the driver), documents packed into sequences with their boundaries.

    data = TextData.load("notes.txt", separator="\\n\\n")
    tokens, cu_seqlens = data.batch(step=3, seq_len=1024)   # (1, N + 1) int64, (0, ..., N)

The tokenizer is the byte: token = one byte of the UTF-8 file, vocabulary 256, nothing to
download. Documents are the file's parts between separators; they are laid end to end in file
order and read as a stream, step i taking the i-th window of N + 1 tokens (wrapping at the end).
`cu_seqlens` marks where each document starts inside the window's N inputs, so attention stays in
its document (the packed-documents path of every algorithm); a token still predicts the next one
across a boundary, as packed pre-training usually does.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from seqpar.errors import require

VOCAB = 256


@dataclass(frozen=True)
class TextData:
    stream: torch.Tensor           # every document's bytes, end to end (int64)
    starts: tuple[int, ...]        # where each document starts in the stream

    @classmethod
    def load(cls, path: str | Path, separator: str = "\n\n") -> TextData:
        p = Path(path)
        require(p.is_file(), "workload.data.text", str(path), "must be a readable text file")
        parts = [d.strip() for d in p.read_text(encoding="utf-8").split(separator)]
        docs = [d.encode("utf-8") for d in parts if d]
        require(bool(docs), "workload.data.text", str(path), "holds no document")
        starts, offset = [], 0
        for d in docs:
            starts.append(offset)
            offset += len(d)
        stream = torch.frombuffer(bytearray(b"".join(docs)), dtype=torch.uint8).to(torch.int64)
        return cls(stream, tuple(starts))

    @property
    def tokens(self) -> int:
        return int(self.stream.numel())

    def tokens_at(self, start: int, count: int) -> torch.Tensor:
        """`count` tokens of the stream from `start`, wrapping at its end (int64)."""
        return self.stream[torch.arange(start, start + count) % self.tokens]

    def batch(self, step: int, seq_len: int) -> tuple[torch.Tensor, tuple[int, ...]]:
        """The step's (1, N + 1) window of the stream and its documents' boundaries over N."""
        return packed_window(self, step, seq_len, "bytes")


@dataclass(frozen=True)
class CorpusData:
    """A corpus's token ids (uint32, memory-mapped: a rank reads the windows it trains on) and
    where each document starts; the same stream interface as TextData."""

    stream: np.ndarray             # every document's ids end to end (uint32, memory-mapped)
    starts: tuple[int, ...]

    @classmethod
    def load(cls, ids_path: str | Path) -> CorpusData:
        """KEY.ids and, beside it, KEY.lengths (one document's token count a line)."""
        p = Path(ids_path)
        require(p.is_file(), "workload.data.corpus", str(p), "its token ids are not there (they are "
                "made on the driver; every node needs the same cache folder)")
        lengths = np.loadtxt(p.with_suffix(".lengths"), dtype=np.int64, ndmin=1)
        starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        return cls(np.memmap(p, dtype=np.uint32, mode="r"), tuple(int(s) for s in starts))

    @property
    def tokens(self) -> int:
        return int(self.stream.size)

    def tokens_at(self, start: int, count: int) -> torch.Tensor:
        idx = np.arange(start, start + count) % self.tokens
        return torch.from_numpy(self.stream[idx].astype(np.int64))

    def batch(self, step: int, seq_len: int) -> tuple[torch.Tensor, tuple[int, ...]]:
        return packed_window(self, step, seq_len, "tokens")


def packed_window(data: TextData | CorpusData, step: int, seq_len: int, unit: str
                  ) -> tuple[torch.Tensor, tuple[int, ...]]:
    """Step `step`'s (1, N + 1) window of the stream and its documents' boundaries over N."""
    require(data.tokens > seq_len, "workload.seq_len", seq_len,
            f"must be shorter than the {'text' if unit == 'bytes' else 'corpus'} ({data.tokens} {unit})")
    start = (step * seq_len) % (data.tokens - seq_len)
    window = data.tokens_at(start, seq_len + 1)
    first = bisect.bisect_right(data.starts, start)
    inside = [s - start for s in data.starts[first:] if s - start < seq_len]
    cu = (0, *inside, seq_len)
    return window[None, :], cu
