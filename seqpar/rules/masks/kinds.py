"""The masks users write: constructors of `Mask` (see the package docstring)."""


from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from seqpar.errors import require
from seqpar.rules.masks.geometry import DENSE_MAX, Mask, Slice
from seqpar.rules.relation import Relation


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
