"""Any attention mask, as a union of slices (MagiAttention's description, no torch).

A `Slice` (q0, q1, k0, k1, kind) says that queries at positions [q0, q1) see keys at [k0, k1) under
one of four shapes (Lq = q1 - q0, Lk = k1 - k0; a query t sees key k of the rectangle when):

- full: always;
- causal: k <= t + (k1 - q1) — the triangle aligned bottom-right (flash-attn's and MagiAttention's
  causal: on a square slice, k <= t);
- inv_causal: k >= t + (k0 - q0) — aligned top-left;
- bi_causal: both (a band: a sliding window's body).

A `Mask` is a union of slices whose visible pairs do not overlap, over N = `n` tokens: query t sees
key k when some slice says so. Every query row sees a union of at most a few key ranges (one per
slice its row crosses), so the planner counts work and bytes from the slices, the block planner
turns each slice into kernel calls (`blocks.block_tasks`), and the ring schedules carry a block only
to ranks some query of which sees it. A query that sees no key at all gets output 0, log-sum-exp
-inf and gradient 0.

Constructors (`n` the length): `full(n)`, `causal(n)`, `documents(cu, causal=True, window=None)`,
`sliding_window(n, w, causal=True)`, `block_sparse(m_blk, block, causal=False)` (BurstEngine §3.4:
a token of query block i sees key block j where m_blk[i][j]), `dilated(n, block, stride, causal=True)`
(query block i sees key blocks j with (i - j) divisible by stride, j <= i when causal: a block-wise
dilated pattern), `prefix_lm(n, prefix)` (a bidirectional prefix, a causal rest),
`shared_question(question, answers)` (a causal question every answer sees in full, each answer
causal and private), `from_dense(m)` (small N), `from_slices(n, slices)`. The classic ones
(`full`, `causal`, `documents`, `sliding_window`) also carry their `Relation` (one contiguous key
range per query), the planner's and the kernels' fast path. `parse(spec, n)` reads the compact form
of each (see `SPECS`); `from_config({"kind": ..., ...}, n)` the same as a mapping.

Held cheaply: the slices are a tuple (a block-sparse mask keeps one slice per run of visible blocks,
runs of equal block rows merged), the hash is computed once, and every per-row count is numpy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Any, NamedTuple

import numpy as np

from seqpar.errors import SeqparError, require
from seqpar.rules.relation import Relation

KINDS = ("full", "causal", "inv_causal", "bi_causal")
DENSE_MAX = 1 << 14  # from_dense and dense() are for small N: at most this many tokens


class Slice(NamedTuple):
    q0: int
    q1: int
    k0: int
    k1: int
    kind: str = "full"

    def bounds(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per query position t of this slice, its visible keys [lo, hi) (hi <= lo: none)."""
        t = np.asarray(t, dtype=np.int64)
        lo = np.full_like(t, self.k0)
        hi = np.full_like(t, self.k1)
        if self.kind in ("causal", "bi_causal"):
            hi = np.minimum(hi, t + (self.k1 - self.q1) + 1)
        if self.kind in ("inv_causal", "bi_causal"):
            lo = np.maximum(lo, t + (self.k0 - self.q0))
        return lo, np.maximum(hi, lo)

    def counts(self) -> np.ndarray:
        """Visible keys of each query row q0..q1-1."""
        lo, hi = self.bounds(np.arange(self.q0, self.q1))
        return hi - lo

    @property
    def area(self) -> int:
        if self.kind == "full":
            return (self.q1 - self.q0) * (self.k1 - self.k0)
        return int(self.counts().sum())


@dataclass(frozen=True, eq=False)
class Mask:
    """A union of disjoint slices over `n` tokens (see the module docstring). `cu`: documents the
    classic layouts deal by (zigzag deals each document), `relation`: the classic relation these
    slices are, if they are one, `spec`: the compact form it was made from."""

    n: int
    slices: tuple[Slice, ...]
    spec: str = ""
    relation: Relation | None = None
    cu: tuple[int, ...] | None = None
    _hash: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.n, self.slices, self.cu)))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, Mask) and self._hash == other._hash
                                 and (self.n, self.cu, self.slices)
                                 == (other.n, other.cu, other.slices))

    def __repr__(self) -> str:
        return f"Mask({self.spec or 'slices'}, n={self.n}, {len(self.slices)} slices)"

    # -- what the algorithms ask of a relation ---------------------------------------------------
    @property
    def plain(self) -> bool:
        """A plain full or causal mask (the papers' byte counts apply unskipped)."""
        return self.relation is not None and self.relation.plain

    @property
    def full(self) -> bool:
        return self.relation is not None and self.relation.full

    @property
    def causal(self) -> bool:
        """Whether no query sees a later key (what the causal FLOP conventions assume)."""
        return all(s.k1 <= s.q0 + 1 or (s.kind in ("causal", "bi_causal") and s.k1 <= s.q1)
                   for s in self.slices)

    def with_cu(self, cu: tuple[int, ...] | None) -> Mask:
        """This mask dealt as the documents `cu` (a call of uneven shards carries (0, n))."""
        rel = self.relation
        if rel is not None:
            rel = Relation(rel.causal, cu, rel.window)
        return Mask(self.n, self.slices, self.spec, rel, cu)

    # -- geometry ---------------------------------------------------------------------------------
    @cached_property
    def area(self) -> int:
        """Visible (query, key) pairs: the work the mask asks for (not N²)."""
        return sum(s.area for s in self.slices)

    @property
    def density(self) -> float:
        return self.area / (self.n * self.n)

    def row_counts(self, n: int | None = None) -> np.ndarray:
        """Visible keys of each query row 0..n-1 (default: this mask's n; rows past it see none)."""
        n = self.n if n is None else n
        return self._row_counts[:n] if n <= self.n else np.concatenate(
            [self._row_counts, np.zeros(n - self.n, dtype=np.int64)])

    @cached_property
    def _row_counts(self) -> np.ndarray:
        out = np.zeros(self.n, dtype=np.int64)
        for s in self.slices:
            out[s.q0:s.q1] += s.counts()
        return out

    def slice_ranges(self, q_pos: np.ndarray, k_pos: np.ndarray
                     ) -> Iterable[tuple[int, np.ndarray, np.ndarray]]:
        """Per slice a query of q_pos (sorted) meets: (first row index, lo, hi) — the rows a0.. of
        q_pos in the slice and, per row, its visible keys as indices [lo, hi) into sorted k_pos."""
        q = np.asarray(q_pos, dtype=np.int64)
        k = np.asarray(k_pos, dtype=np.int64)
        if q.size == 0 or k.size == 0:
            return
        for s in self._meeting(q, k):
            a0, a1 = np.searchsorted(q, [s.q0, s.q1])
            if a1 <= a0:
                continue
            lo, hi = s.bounds(q[a0:a1])
            lo_i = np.searchsorted(k, lo)
            hi_i = np.maximum(np.searchsorted(k, hi), lo_i)
            if (hi_i > lo_i).any():
                yield int(a0), lo_i, hi_i

    def _meeting(self, q: np.ndarray, k: np.ndarray) -> list[Slice]:
        """The slices whose rectangle meets the span of q and of k (a cheap filter)."""
        qa, qb, ka, kb = int(q[0]), int(q[-1]), int(k[0]), int(k[-1])
        return [s for s in self.slices if s.q0 <= qb and s.q1 > qa and s.k0 <= kb and s.k1 > ka]

    def pairs(self, q_pos: np.ndarray, k_pos: np.ndarray) -> int:
        """Visible pairs between queries at q_pos and keys at k_pos (both sorted)."""
        return int(sum((hi - lo).sum() for _, lo, hi in self.slice_ranges(q_pos, k_pos)))

    def sees(self, q_pos: np.ndarray, k_pos: np.ndarray) -> bool:
        """Whether any query at q_pos sees any key at k_pos (both sorted)."""
        return any((hi > lo).any() for _, lo, hi in self.slice_ranges(q_pos, k_pos))

    def dense(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows start..stop of the boolean mask (rows, n), True where the row's query sees the
        column's key: the definition, for tests and the float64 reference."""
        stop = self.n if stop is None else stop
        out = np.zeros((stop - start, self.n), dtype=bool)
        keys = np.arange(self.n)
        for s in self.slices:
            a, b = max(s.q0, start), min(s.q1, stop)
            if b <= a:
                continue
            lo, hi = s.bounds(np.arange(a, b))
            out[a - start:b - start] |= (keys >= lo[:, None]) & (keys < hi[:, None])
        return out


# ------------------------------------------------------------------------------------- checking
def check_slices(n: int, slices: Sequence[Slice], field_name: str = "mask.slices") -> None:
    """Each slice inside [0, n) with a known kind and at least one visible pair; no pair in two
    slices. Raises ConfigError naming the first slice that breaks a rule."""
    require(isinstance(n, int | np.integer) and n > 0, "mask.n", n, "must be a positive integer")
    require(len(slices) > 0, field_name, [], "must hold at least one slice")
    for i, s in enumerate(slices):
        name = f"{field_name}[{i}]"
        require(len(s) == 5 and all(isinstance(x, int | np.integer) for x in s[:4]), name,
                tuple(s), "must be (q0, q1, k0, k1, kind) with integer ranges")
        require(0 <= s.q0 < s.q1 <= n and 0 <= s.k0 < s.k1 <= n, name, tuple(s),
                f"q and k ranges must be non-empty and inside [0, {n})")
        require(s.kind in KINDS, name, tuple(s), f"kind must be one of {', '.join(KINDS)}")
        require(s.area > 0, name, tuple(s), "sees no pair (an empty bi_causal band)")
    _check_disjoint(slices, field_name)


def _check_disjoint(slices: Sequence[Slice], field_name: str) -> None:
    order = sorted(range(len(slices)), key=lambda i: slices[i].q0)
    for x, i in enumerate(order):
        a = slices[i]
        for j in order[x + 1:]:
            b = slices[j]
            if b.q0 >= a.q1:
                break
            if b.k0 >= a.k1 or a.k0 >= b.k1:
                continue
            rows = np.arange(max(a.q0, b.q0), min(a.q1, b.q1))
            (alo, ahi), (blo, bhi) = a.bounds(rows), b.bounds(rows)
            both = np.minimum(ahi, bhi) - np.maximum(alo, blo)
            require(not (both > 0).any(), f"{field_name}[{j}]", tuple(b),
                    f"overlaps {field_name}[{i}] {tuple(a)}: a (query, key) pair would count twice")


def from_slices(n: int, slices: Iterable[Sequence[Any]], spec: str = "") -> Mask:
    """A mask from a list of (q0, q1, k0, k1, kind) (kind default 'full'), checked."""
    parsed = tuple(Slice(*(int(x) for x in s[:4]), *(str(x) for x in s[4:5]))
                   if not isinstance(s, Slice) else s for s in slices)
    check_slices(n, parsed)
    return Mask(n, parsed, spec or f"slices:{len(parsed)}")


# ----------------------------------------------------------------------------------- constructors
def _band(a: int, b: int, window: int | None, causal: bool) -> list[Slice]:
    """Slices of one document [a, b): causal or full, within a window (None: none). Rows are cut
    where the window's lower edge stops being clipped by the document's start (c1) and, full, where
    its upper edge starts being clipped by its end (c2); each run of rows is one slice."""
    if window is None or window >= b - a:
        return [Slice(a, b, a, b, "causal" if causal else "full")]
    w = window
    c1, c2 = a + w - 1, b - w  # rows < c1 see from a; full rows >= c2 see up to b - 1
    cuts = sorted({a, b, *(c for c in (c1, None if causal else c2) if c is not None and a < c < b)})
    out = []
    for r0, r1 in zip(cuts, cuts[1:], strict=False):
        low, high = r0 < c1, (not causal) and r0 >= c2
        k0 = a if low else r0 - w + 1
        if causal:
            out.append(Slice(r0, r1, k0, r1, "causal" if low else "bi_causal"))
        elif high:
            out.append(Slice(r0, r1, k0, b, "full" if low else "inv_causal"))
        else:
            out.append(Slice(r0, r1, k0, r1 + w - 1, "causal" if low else "bi_causal"))
    return out


def documents(cu: Sequence[int], causal: bool = True, window: int | None = None) -> Mask:
    """Packed documents (global boundaries [0, ..., N]): a query sees keys of its own document,
    causal or not, within a window (query t: keys t-W+1..t causal, |t - s| < W full)."""
    cu = tuple(int(x) for x in cu)
    require(len(cu) >= 2 and cu[0] == 0 and all(b > a for a, b in zip(cu, cu[1:], strict=False)),
            "cu_seqlens", list(cu), "must increase strictly from 0 to N")
    require(window is None or (isinstance(window, int) and window > 0), "window", window,
            "must be a positive integer (or None: no window)")
    slices = tuple(s for a, b in zip(cu, cu[1:], strict=False) for s in _band(a, b, window, causal))
    one = len(cu) == 2
    lengths = ",".join(str(b - a) for a, b in zip(cu, cu[1:], strict=False))
    if one:
        name = "causal" if causal else "full"
        name = name if window is None else f"window:{window}" + ("" if causal else ":full")
    else:
        name = f"documents:{lengths}" + ("" if causal else ":full") + (
            "" if window is None else f":window={window}")
    return Mask(cu[-1], slices, name, Relation(causal, None if one else cu, window),
                None if one else cu)


def full(n: int) -> Mask:
    """Every query sees every key."""
    return documents((0, _length(n)), causal=False)


def causal(n: int) -> Mask:
    """Query t sees keys 0..t."""
    return documents((0, _length(n)), causal=True)


def sliding_window(n: int, w: int, causal: bool = True) -> Mask:
    """Query t sees keys t-w+1..t (causal) or keys s with |t - s| < w (bidirectional)."""
    require(isinstance(w, int) and w > 0, "window", w, "must be a positive integer")
    return documents((0, _length(n)), causal=causal, window=w)


def _length(n: int) -> int:
    require(isinstance(n, int | np.integer) and n > 0, "seq_len", n, "must be a positive integer")
    return int(n)


def block_sparse(m_blk: Any, block: int, causal: bool = False) -> Mask:
    """BurstEngine's block-wise sparse attention (§3.4): N = len(m_blk) * block tokens in blocks of
    `block`; every token of query block i sees every key of block j where m_blk[i][j]. With
    `causal`, a diagonal block is causal and blocks above the diagonal must be unmarked."""
    m = np.asarray(m_blk).astype(bool)
    require(m.ndim == 2 and m.shape[0] == m.shape[1] and m.shape[0] > 0, "m_blk.shape",
            tuple(m.shape), "must be square (N/block x N/block)")
    require(isinstance(block, int | np.integer) and block > 0, "block", block,
            "must be a positive integer")
    require(m.any(axis=1).any(), "m_blk", "all False", "must mark at least one block")
    if causal:
        above = np.argwhere(np.triu(m, 1))
        require(len(above) == 0, "m_blk", f"block {tuple(int(x) for x in above[0])}"
                if len(above) else None, "is above the diagonal of a causal block mask")
    nb = m.shape[0]
    slices: list[Slice] = []
    i = 0
    while i < nb:
        j = i + 1
        while j < nb and not causal and (m[j] == m[i]).all():
            j += 1
        for c0, c1 in _runs(m[i]):
            if causal and c0 <= i < c1:  # the diagonal block: causal; what lies left of it full
                if c0 < i:
                    slices.append(Slice(i * block, j * block, c0 * block, i * block, "full"))
                slices.append(Slice(i * block, j * block, i * block, j * block, "causal"))
            else:
                slices.append(Slice(i * block, j * block, c0 * block, c1 * block, "full"))
        i = j
    spec = f"block_sparse[{nb}x{nb}]:{block}" + (":causal" if causal else "")
    return Mask(nb * int(block), tuple(slices), spec)


def _runs(row: np.ndarray) -> list[tuple[int, int]]:
    """[c0, c1) of every run of True in a boolean row."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], row.astype(np.int8), [0]])))
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def dilated(n: int, block: int, stride: int, causal: bool = True) -> Mask:
    """Block-wise dilated attention: in blocks of `block`, query block i sees key blocks j with
    (i - j) divisible by `stride` (j <= i when causal, its own block causal)."""
    n = _length(n)
    require(isinstance(block, int) and block > 0 and n % block == 0, "block", block,
            f"must be a positive integer dividing seq_len={n}")
    require(isinstance(stride, int) and stride >= 1, "stride", stride,
            "must be a positive integer (1: every block)")
    nb = n // block
    i, j = np.indices((nb, nb))
    m = (i - j) % stride == 0
    if causal:
        m &= j <= i
    mask = block_sparse(m, block, causal)
    return Mask(mask.n, mask.slices, f"dilated:{block}:{stride}" + ("" if causal else ":full"))


def random_block_sparse(n: int, block: int, density: float, seed: int = 0,
                        causal: bool = False) -> Mask:
    """A block-sparse mask whose blocks are marked at random with probability `density` (the
    diagonal always), from `seed`: the random masks the balance studies draw."""
    n = _length(n)
    require(isinstance(block, int) and block > 0 and n % block == 0, "block", block,
            f"must be a positive integer dividing seq_len={n}")
    require(0 < density <= 1, "density", density, "must be in (0, 1]")
    nb = n // block
    m = np.random.default_rng(seed).random((nb, nb)) < density
    np.fill_diagonal(m, True)
    if causal:
        m = np.tril(m)
    mask = block_sparse(m, block, causal)
    return Mask(mask.n, mask.slices, f"block_sparse:{block}:{density}:{seed}"
                + (":causal" if causal else ""))


def prefix_lm(n: int, prefix: int) -> Mask:
    """A bidirectional prefix (tokens 0..prefix-1 see each other) and a causal rest (token t >=
    prefix sees keys 0..t)."""
    n = _length(n)
    require(isinstance(prefix, int) and 0 < prefix <= n, "prefix", prefix,
            f"must be in [1, seq_len={n}]")
    slices = [Slice(0, prefix, 0, prefix, "full")]
    if prefix < n:
        slices.append(Slice(prefix, n, 0, n, "causal"))
    return Mask(n, tuple(slices), f"prefix_lm:{prefix}")


def shared_question(question: int, answers: Sequence[int]) -> Mask:
    """One question of `question` tokens (causal) that every answer sees in full; each answer
    (lengths `answers`, packed after the question) causal and private: an answer never sees
    another answer."""
    require(isinstance(question, int) and question > 0, "question", question,
            "must be a positive integer")
    answers = [int(a) for a in answers]
    require(len(answers) > 0 and all(a > 0 for a in answers), "answers", answers,
            "must be one or more positive lengths")
    n = question + sum(answers)
    slices = [Slice(0, question, 0, question, "causal"), Slice(question, n, 0, question, "full")]
    a0 = question
    for a in answers:
        slices.append(Slice(a0, a0 + a, a0, a0 + a, "causal"))
        a0 += a
    return Mask(n, tuple(slices), f"shared_question:{question}:{','.join(map(str, answers))}")


def from_dense(m: Any) -> Mask:
    """A mask from a boolean N x N matrix (True where the query row sees the key column), for small
    N: each row's runs of visible keys, runs of rows whose edges step alike merged into slices."""
    d = np.asarray(m).astype(bool)
    require(d.ndim == 2 and d.shape[0] == d.shape[1] and d.shape[0] > 0, "mask.shape",
            tuple(d.shape), "must be square (N x N)")
    n = d.shape[0]
    require(n <= DENSE_MAX, "mask.shape", tuple(d.shape), f"from_dense takes N <= {DENSE_MAX}")
    require(d.any(), "mask", "all False", "must let some query see some key")
    rows = [_runs(d[t]) for t in range(n)]
    slices: list[Slice] = []
    t = 0
    while t < n:
        runs = rows[t]
        if not runs:
            t += 1
            continue
        u = t + 1
        steps = None
        while u < n and len(rows[u]) == len(runs):
            step = [(b[0] - a[0], b[1] - a[1]) for a, b in zip(rows[u - 1], rows[u], strict=True)]
            if any(s not in ((0, 0), (0, 1), (1, 1), (1, 0)) for s in step) or (
                    steps is not None and step != steps):
                break
            steps = step
            u += 1
        for x, (lo, _) in enumerate(runs):
            dl, dh = steps[x] if steps else (0, 0)
            kind = {(0, 0): "full", (0, 1): "causal", (1, 1): "bi_causal",
                    (1, 0): "inv_causal"}[(dl, dh)]
            slices.append(Slice(t, u, lo, rows[u - 1][x][1], kind))
        t = u
    return Mask(n, tuple(slices), f"dense:{n}")


# ------------------------------------------------------------------------------------ spec forms
SPECS = {
    "full": "full",
    "causal": "causal",
    "window": "window:W[:full]  (causal unless :full)",
    "documents": "documents:L1,L2,...[:full][:window=W]  (document lengths; causal unless :full)",
    "block_sparse": "block_sparse:BLOCK:DENSITY[:SEED][:causal]  (random blocks, diagonal kept)",
    "dilated": "dilated:BLOCK:STRIDE[:full]",
    "prefix_lm": "prefix_lm:PREFIX",
    "shared_question": "shared_question:Q:A1,A2,...",
    "slices": "slices:Q0-Q1/K0-K1/KIND;...  (any mask: its slices; KIND full | causal | "
              "inv_causal | bi_causal)",
}


def parse(spec: str | Mapping[str, Any] | Mask, n: int) -> Mask:
    """A mask of n tokens from its compact form (`SPECS`), a mapping {kind: ..., ...} or itself."""
    if isinstance(spec, Mask):
        require(spec.n == n, "mask.n", spec.n, f"must equal seq_len={n}")
        return spec
    if isinstance(spec, Mapping):
        return from_config(spec, n)
    require(isinstance(spec, str) and spec, "mask", spec,
            f"must be one of the forms {'; '.join(SPECS.values())}")
    return _parse(spec, n)


def as_spec(mask: Mask) -> str:
    """A compact form that parses back to exactly this mask: its own spec where it has one, else
    its slices (`SPECS['slices']`)."""
    if mask.spec and mask.spec.split(":")[0] in SPECS:
        try:
            if _parse(mask.spec, mask.n) == mask:
                return mask.spec
        except SeqparError:
            pass
    return "slices:" + ";".join(f"{s.q0}-{s.q1}/{s.k0}-{s.k1}/{s.kind}" for s in mask.slices)


@lru_cache(maxsize=256)
def _parse(spec: str, n: int) -> Mask:
    kind, *args = spec.split(":")
    if kind == "slices":
        try:
            parts = [p.split("/") for p in ":".join(args).split(";") if p]
            slices = [(*map(int, q.split("-")), *map(int, k.split("-")), *rest)
                      for q, k, *rest in parts]
        except ValueError:
            require(False, "mask", spec, f"must read {SPECS['slices']}")
        return from_slices(n, slices, spec)
    flags = {a for a in args if a in ("full", "causal")}
    args = [a for a in args if a not in ("full", "causal")]
    config: dict[str, Any] = {"kind": kind}
    try:
        if kind == "window":
            config |= {"window": int(args[0]), "causal": "full" not in flags}
        elif kind == "documents":
            config["lengths"] = [int(x) for x in args[0].split(",")]
            config |= {k: int(v) for k, v in (a.split("=") for a in args[1:])}
            config["causal"] = "full" not in flags
        elif kind == "block_sparse":
            config |= {"block": int(args[0]), "density": float(args[1]),
                       "seed": int(args[2]) if len(args) > 2 else 0, "causal": "causal" in flags}
        elif kind == "dilated":
            config |= {"block": int(args[0]), "stride": int(args[1]), "causal": "full" not in flags}
        elif kind == "prefix_lm":
            config["prefix"] = int(args[0])
        elif kind == "shared_question":
            config |= {"question": int(args[0]), "answers": [int(x) for x in args[1].split(",")]}
    except (IndexError, ValueError):
        require(False, "mask", spec, f"must read {SPECS.get(kind, kind)}")
    return from_config(config, n)


def from_config(config: Mapping[str, Any], n: int) -> Mask:
    """A mask from {kind: full | causal | window | documents | block_sparse | dilated | prefix_lm |
    shared_question, ...its constructor's arguments} for n tokens."""
    c = dict(config)
    kind = c.pop("kind", None)
    require(kind in SPECS, "mask.kind", kind, f"must be one of {', '.join(SPECS)}")
    try:
        if kind == "full":
            mask = full(n)
        elif kind == "causal":
            mask = causal(n)
        elif kind == "window":
            mask = sliding_window(n, c.pop("window"), c.pop("causal", True))
        elif kind == "documents":
            lengths = [int(x) for x in c.pop("lengths")]
            require(sum(lengths) == n, "mask.lengths", lengths, f"must add up to seq_len={n}")
            cu = np.concatenate([[0], np.cumsum(lengths)]).tolist()
            mask = documents(cu, c.pop("causal", True), c.pop("window", None))
        elif kind == "block_sparse":
            mask = random_block_sparse(n, c.pop("block"), float(c.pop("density")),
                                       c.pop("seed", 0), c.pop("causal", False))
        elif kind == "dilated":
            mask = dilated(n, c.pop("block"), c.pop("stride"), c.pop("causal", True))
        elif kind == "prefix_lm":
            mask = prefix_lm(n, c.pop("prefix"))
        else:
            mask = shared_question(c.pop("question"), c.pop("answers"))
    except KeyError as missing:
        require(False, f"mask.{missing.args[0]}", None, f"is required: {SPECS[kind]}")
    require(not c, "mask", sorted(c), f"unknown keys for kind {kind}: {SPECS[kind]}")
    require(mask.n == n, "mask.n", mask.n, f"must equal seq_len={n}")
    return mask
