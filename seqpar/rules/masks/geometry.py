"""The mask type: a union of slices (see the package docstring), its geometry and its checks."""


from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple

import numpy as np

from seqpar.errors import require
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
