"""Sequence lengths as a workload: the distributions a step's sequences come from, and the draw.

    dist = parse("lognormal:mean=1024,sigma=1.5,min=128,max=8192")
    steps = draw_batches(dist, tokens=65536, longest=8192, seed=0, count=2)  # 2 batches of 65536
    split_total(8192, count=16, sigma=1.25, seed=0)   # documents filling one sequence of 8192

Compact forms: `fixed:N`; `lognormal:mean=M,sigma=S,min=A,max=B` (L = clip(LogNormal(ln M - S²/2,
S), A, B), rounded: the unclipped mean is M); `file:PATH` (one length a line, or a JSON list of
integers: a corpus's own lengths, drawn uniformly with replacement); `text:PATH` (the documents of
a UTF-8 text file, split at blank lines, one token a byte, read in file order and wrapping);
`corpus:SOURCE?tokenizer=TOK&column=text&limit=N` (a corpus's documents through its tokenizer,
drawn as `file:`; column and limit optional). The rules only parse the corpus form (`CorpusRef`):
the tokenizing is seqpar.corpus's, handed in as `corpus=` (a function returning the file of
lengths, cached by digests), so this floor reads a file of lengths and nothing else.

A step is `tokens` tokens of whole sequences: sequences are drawn one after another until they
hold `tokens`; the last one is cut to the tokens still missing, so every step holds exactly
`tokens` (a sequence longer than `longest`, the workload's seq_len, is cut to `longest`). The
draw of batch b is seeded by (seed, b), the same on every rank and every machine (Python's `random`).

`split_total` is `workload.documents`'s draw: `count` lengths from the same log-normal (sigma is
its `spread`), scaled to fill one sequence of `total`: the one static pack that documents always
were. Both take the normal deviates from the same stream, so sigma means the same in both.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from seqpar.errors import ConfigError, require

FORMS = ("fixed:N", "lognormal:mean=M,sigma=S,min=A,max=B", "file:PATH", "text:PATH",
         "corpus:SOURCE?tokenizer=TOK&column=text")
CORPUS_KEYS = ("tokenizer", "column", "limit")
TEXT_SEPARATOR = "\n\n"


@dataclass(frozen=True)
class Sequence:
    """One sequence of a step: its length and where its tokens come from (the document's index
    for `text:`, else the draw's own number, which seeds random tokens)."""

    length: int
    source: int


@dataclass(frozen=True)
class Fixed:
    n: int

    def draw(self, rng: random.Random, index: int) -> Sequence:
        return Sequence(self.n, index)

    def sample(self) -> tuple[int, ...]:
        return (self.n,)

    @property
    def low(self) -> int:
        """The shortest sequence it gives (every distribution has low and high)."""
        return self.n

    @property
    def high(self) -> int:
        """The longest sequence it gives."""
        return self.n

    @property
    def spec(self) -> str:
        return f"fixed:{self.n}"


@dataclass(frozen=True)
class LogNormal:
    mean: float
    sigma: float
    low: int
    high: int

    def draw(self, rng: random.Random, index: int) -> Sequence:
        z = rng.gauss(0.0, 1.0)
        x = self.mean * math.exp(self.sigma * z - self.sigma ** 2 / 2)
        return Sequence(min(self.high, max(self.low, round(x))), index)

    def sample(self, count: int = 4096, seed: int = 0) -> tuple[int, ...]:
        """`count` seeded lengths: what a planner reads of the distribution."""
        rng = random.Random(seed)
        return tuple(self.draw(rng, i).length for i in range(count))

    @property
    def spec(self) -> str:
        return (f"lognormal:mean={_num(self.mean)},sigma={_num(self.sigma)},min={self.low},"
                f"max={self.high}")


@dataclass(frozen=True)
class CorpusRef:
    """The `corpus:` form: a corpus, its tokenizer, the text column and how many documents to read
    (None: all). `body` is the form after `corpus:`, canonical (keys in one order)."""

    source: str
    tokenizer: str
    column: str = "text"
    limit: int | None = None

    @property
    def body(self) -> str:
        query = f"tokenizer={self.tokenizer}&column={self.column}"
        return f"{self.source}?{query}" + (f"&limit={self.limit}" if self.limit else "")


@dataclass(frozen=True)
class Empirical:
    """Lengths read from a file (`file:`, and a corpus's tokenized lengths, `corpus:`: drawn
    uniformly with replacement) or the documents of a text (`text:`, in file order, wrapping)."""

    lengths: tuple[int, ...]
    path: str
    kind: str  # file | text | corpus

    def draw(self, rng: random.Random, index: int) -> Sequence:
        if self.kind == "text":
            i = index % len(self.lengths)
        else:
            i = rng.randrange(len(self.lengths))
        return Sequence(self.lengths[i], i)

    def sample(self) -> tuple[int, ...]:
        return self.lengths

    @property
    def low(self) -> int:
        return min(self.lengths)

    @property
    def high(self) -> int:
        return max(self.lengths)

    @property
    def spec(self) -> str:
        return f"{self.kind}:{self.path}"


Distribution = Fixed | LogNormal | Empirical


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def text_documents(text: str, separator: str = TEXT_SEPARATOR) -> list[bytes]:
    """The documents of a text, as the byte tokenizer sees them: parts between separators,
    stripped, empty ones dropped (model.text reads a file the same way)."""
    return [d.encode("utf-8") for d in (p.strip() for p in text.split(separator)) if d]


def parse(spec: str, field: str = "lengths", resolve: Callable[[str], str] | None = None,
          corpus: Callable[[CorpusRef, str], str] | None = None) -> Distribution:
    """The distribution of a compact form; a bad one raises ConfigError(field, spec, rule) in one
    line. `resolve` maps a path as written to the file to read (e.g. `shipped:NAME`); `corpus`
    gives a `corpus:` form's file of lengths, one a line in corpus order (seqpar.corpus.cache.
    lengths_file: tokenized once, then cached), given the form and the field to blame."""
    require(isinstance(spec, str) and ":" in spec, field, spec, f"must be one of {', '.join(FORMS)}")
    kind, _, body = spec.partition(":")
    if kind == "fixed":
        require(body.isdigit() and int(body) > 0, field, spec,
                "fixed:N takes a positive integer length N")
        return Fixed(int(body))
    if kind == "lognormal":
        return _lognormal(spec, body, field)
    if kind in ("file", "text"):
        require(bool(body), field, spec, f"{kind}:PATH needs a path")
        path = Path(resolve(body) if resolve is not None else body)
        require(path.is_file(), field, spec, f"{kind}:PATH must name a readable file (no file at "
                f"{path})")
        read = _file_lengths if kind == "file" else _text_lengths
        return Empirical(read(path, spec, field), body, kind)
    if kind == "corpus":
        ref = corpus_ref(spec, field)
        require(corpus is not None, field, spec, "a corpus is tokenized by seqpar.corpus, not "
                "here: give it where seqpar reads lengths (seqpar plan --lengths, a sweep's "
                "workload.lengths) or write its lengths with seqpar lengths --out and use file:PATH")
        assert corpus is not None
        path = Path(corpus(ref, field))
        return Empirical(_file_lengths(path, spec, field), ref.body, "corpus")
    raise ConfigError(field, spec, f"must be one of {', '.join(FORMS)}")


def corpus_ref(spec: str, field: str = "lengths") -> CorpusRef:
    """The parts of `corpus:SOURCE?tokenizer=TOK&column=C&limit=N` (column: text; limit: none),
    checked for form only (the paths are checked where they are read)."""
    body = spec.removeprefix("corpus:")
    source, q, query = body.partition("?")
    rule = "corpus:SOURCE?tokenizer=TOK[&column=C][&limit=N] takes tokenizer=, column=, limit=, once"
    require(bool(source) and q == "?", field, spec, rule)
    values: dict[str, str] = {}
    for part in query.split("&"):
        key, eq, value = part.partition("=")
        require(eq == "=" and key in CORPUS_KEYS and key not in values and bool(value), field,
                spec, rule)
        values[key] = value
    require("tokenizer" in values, field, spec, "corpus: needs its tokenizer: "
            "corpus:SOURCE?tokenizer=TOK (a tokenizer.json or a folder holding one)")
    limit = values.get("limit")
    require(limit is None or (limit.isdigit() and int(limit) >= 1), field, spec,
            f"limit={limit} must be a positive number of documents")
    return CorpusRef(source, values["tokenizer"], values.get("column", "text"),
                     int(limit) if limit is not None else None)


def _lognormal(spec: str, body: str, field: str) -> LogNormal:
    keys = ("mean", "sigma", "min", "max")
    values: dict[str, float] = {}
    for part in body.split(","):
        key, eq, value = part.partition("=")
        require(eq == "=" and key in keys and key not in values, field, spec,
                "lognormal takes mean=M,sigma=S,min=A,max=B, each once")
        try:
            values[key] = float(value)
        except ValueError:
            raise ConfigError(field, spec, f"lognormal's {key} must be a number "
                                           f"(got {value!r})") from None
    missing = ", ".join(k for k in keys if k not in values)
    require(not missing, field, spec, f"lognormal needs mean, sigma, min and max (missing {missing})")
    low, high = values["min"], values["max"]
    require(low.is_integer() and high.is_integer() and low >= 1, field, spec,
            "min and max are whole token counts, min >= 1")
    require(low <= high, field, spec, f"min={int(low)} must be at most max={int(high)}")
    require(values["sigma"] >= 0, field, spec, f"sigma={_num(values['sigma'])} must be >= 0")
    require(low <= values["mean"] <= high, field, spec,
            f"mean={_num(values['mean'])} must lie in [min, max] = [{int(low)}, {int(high)}]")
    return LogNormal(values["mean"], values["sigma"], int(low), int(high))


def _file_lengths(path: Path, spec: str, field: str) -> tuple[int, ...]:
    text = path.read_text(encoding="utf-8").strip()
    require(bool(text), field, spec, "the lengths file is empty")
    try:
        raw = json.loads(text) if text.startswith("[") else [ln for ln in text.split() if ln]
        values = [int(v) if isinstance(v, int) or str(v).strip().isdigit() else None for v in raw]
    except (ValueError, TypeError):
        values = [None]
    require(bool(values) and all(v is not None and v >= 1 for v in values), field, spec,
            "the lengths file must hold positive integers, one a line or a JSON list")
    return tuple(int(v) for v in values if v is not None)


def _text_lengths(path: Path, spec: str, field: str) -> tuple[int, ...]:
    docs = text_documents(path.read_text(encoding="utf-8"))
    require(bool(docs), field, spec, "the text holds no document")
    return tuple(len(d) for d in docs)


def draw_batches(dist: Distribution, tokens: int, longest: int, seed: int, count: int
                 ) -> tuple[tuple[Sequence, ...], ...]:
    """`count` batches of sequences: whole sequences until `tokens` are held, the last cut to the
    tokens still missing, each at most `longest` (see the module docstring). A text's documents
    are read on from where the batch before stopped."""
    require(isinstance(tokens, int) and tokens >= 1, "tokens_per_step", tokens,
            "must be a positive integer")
    batches, index = [], 0
    for batch in range(count):
        rng = random.Random(seed * 1_000_003 + batch)
        out: list[Sequence] = []
        held = 0
        while held < tokens:
            s = dist.draw(rng, index)
            index += 1
            n = min(s.length, longest, tokens - held)
            out.append(Sequence(n, s.source))
            held += n
        batches.append(tuple(out))
    return tuple(batches)


def split_total(total: int, count: int, sigma: float, seed: int) -> tuple[int, ...]:
    """`count` lengths summing to `total` (>= count): log-normal weights exp(sigma * z) (the same
    deviates as LogNormal.draw), the total dealt in proportion (largest remainder, every length at
    least 1). sigma 0 gives equal lengths; the order of the draw is the order in the sequence."""
    rng = random.Random(seed)
    weights = [math.exp(sigma * rng.gauss(0.0, 1.0)) for _ in range(count)]
    free = total - count  # every document has one token; the rest is dealt by weight
    shares = [free * w / sum(weights) for w in weights]
    lengths = [1 + math.floor(s) for s in shares]
    rest = total - sum(lengths)
    by_remainder = sorted(range(count), key=lambda i: (math.floor(shares[i]) - shares[i], i))
    for i in by_remainder[:rest]:
        lengths[i] += 1
    return tuple(lengths)


def boundaries(lengths: tuple[int, ...] | list[int]) -> tuple[int, ...]:
    """Cumulative boundaries [0, ..., N] (cu_seqlens) of the lengths."""
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return tuple(cu)
