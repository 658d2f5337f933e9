"""How a sequence of N tokens is dealt to P ranks, and which (query, key) blocks a causal mask keeps.

- contiguous: rank r holds tokens [r*s, (r+1)*s) with s = N/P.
- zigzag: the sequence is cut into 2P chunks; rank r holds chunks r and 2P-1-r (balanced causal work).
- stripe: token t goes to rank t mod P (balanced; BurstEngine Eq. 14).

Every rank's token positions come out sorted, so a causal mask between a query block and a key
block is a *prefix* mask: query row a sees the first `count[a]` keys. `block_tasks` turns any such
pair of position lists into a few kernel calls with the masks the kernels know (full, causal,
shifted). This is the one place the causal block relations live; algorithms never special-case a
layout.

Documents and windows are more kinds of relation (`Relation`): with `cu_seqlens` (global document
boundaries [0, ..., N]) a query sees only keys of its own document, and with a `window` W a causal
query t sees keys t-W+1..t (without `causal`: keys s with |t - s| < W), always inside its document.
For sorted key positions every query row then sees one *contiguous range* of key indices
[lo, hi); `block_tasks` cuts the rows into runs where lo and hi each stay put or step by one per row
and emits one or two kernel calls per run: full, causal (hi steps), or 'band' (lo steps: a window's
lower edge; the kernel takes the band's two diagonal offsets). Rows and blocks no query can see get
no call at all (no compute); `sees` and `layout_need` say which rank pairs see each other at all,
from which the ring schedules skip transfers (`route`, option `skip_transfers`).

Documents in the layouts: contiguous and stripe deal tokens exactly as without documents (stripe's
round robin keeps every document's causal work balanced to within one row per rank). zigzag deals
*each document* in 2P equal chunks, rank r taking chunks r and 2P-1-r of every document, so that every
rank holds the same causal work of every document; a document's last L mod 2P tokens (its tail) go
round robin over the ranks, the rotation running on across documents. Without documents this is the
classic zigzag. Positions stay sorted on every rank. (With a sliding window the band, not the
triangle, is the work: stripe balances it best, see benchmarks/document_balance.py.)

Any length: with cu_seqlens (at least [0, N]) N need not divide into the layout's pieces.
contiguous cuts at r*N//P, stripe deals t mod P, zigzag as above: every rank holds floor(N/P) or
ceil(N/P) tokens. `Attention` pads each rank's shard to s = ceil(N/P) rows at its end (padding rows
hold positions N + r*s + j: no query sees them, they see nothing; the algorithms run on equal
shards of s rows and the padding is cut off again), so every message has s rows and the bytes are
those of N' = s*P tokens (`AttnShape.shard_len`).

One rule for the length, in every layout: any N. A plain call (no cu_seqlens) is dealt as the one
document [0, N] is, so N need not divide into the layout's pieces (136 tokens over 8 zigzag ranks:
17 each, exact), only over the ranks: every rank then holds N/P tokens and knows N from its own
shard (`check_seq_len`). Uneven shards (N mod P != 0) carry N as cu_seqlens=[0, N] (`call_cu`:
what a Case, the spec and `seqpar check` hand the attention for such a length).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from seqpar.errors import require

LAYOUTS = ("contiguous", "zigzag", "stripe")


def chunk_count(layout: str, world: int) -> int:
    """How many equal pieces the classic deal cuts a sequence into (a length that does not divide
    into them deals its last N mod pieces tokens round robin, `_dealt`)."""
    check_layout(layout)
    return 2 * world if layout == "zigzag" else world


def check_layout(layout: str) -> None:
    require(layout in LAYOUTS, "layout", layout, f"must be one of {', '.join(LAYOUTS)}")


def check_seq_len(layout: str, world: int, seq_len: int,
                  cu: tuple[int, ...] | None = None) -> None:
    """Any N > 0 with cu_seqlens; without them N must split evenly over the ranks (every rank then
    holds N/P tokens and knows N from its own shard), in every layout."""
    check_layout(layout)
    if cu is not None:
        require(seq_len > 0, "seq_len", seq_len, "must be positive")
        return
    require(seq_len > 0 and seq_len % world == 0, "seq_len", seq_len,
            f"must be a positive multiple of world={world} without cu_seqlens (ranks of uneven "
            f"shards cannot tell N; any length with cu_seqlens=[0, N])")


def shard_len(seq_len: int, world: int) -> int:
    """Rows of every rank's (padded) shard: ceil(N / P)."""
    return -(-seq_len // world)


def normal_cu(layout: str, world: int, seq_len: int, cu_seqlens) -> tuple[int, ...] | None:
    """cu_seqlens as the relation keeps them: None for one document of a length that splits evenly
    over the ranks (a plain call: the deal is the same), else a tuple."""
    cu = as_cu(cu_seqlens)
    if cu is not None and len(cu) == 2 and cu[0] == 0 and cu[1] == seq_len \
            and seq_len % world == 0:
        return None
    return cu


def call_cu(world: int, seq_len: int, cu: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """The documents a call on N tokens runs with: cu as given; without them, none when N splits
    over the ranks (a plain call), else one document [0, N] (uneven shards carry N)."""
    if cu:
        return cu
    return None if seq_len % world == 0 else (0, seq_len)


def check_documents(layout: str, world: int, seq_len: int, cu: tuple[int, ...] | None) -> None:
    """cu_seqlens must run 0 < ... < N strictly increasing (N: the real length, at most the padded
    seq_len of the algorithm's shards)."""
    if cu is None:
        return
    require(len(cu) >= 2 and cu[0] == 0 and 0 < cu[-1] <= seq_len
            and all(b > a for a, b in zip(cu, cu[1:], strict=False)), "cu_seqlens", list(cu),
            f"must increase strictly from 0 to seq_len={seq_len}")


@lru_cache(maxsize=4096)
def _positions(layout: str, rank: int, world: int, seq_len: int,
               cu: tuple[int, ...] | None = None) -> tuple[int, ...]:
    check_seq_len(layout, world, seq_len, cu)
    check_documents(layout, world, seq_len, cu)
    require(0 <= rank < world, "rank", rank, f"must be in [0, {world})")
    n = cu[-1] if cu is not None else seq_len
    real = _dealt(layout, rank, world, n, cu if cu is not None else (0, n))
    if seq_len == n:
        return real
    s = seq_len // world  # padded shard: positions N + rank*s + j after the real ones
    return real + tuple(n + rank * s + j for j in range(s - len(real)))


def _dealt(layout: str, rank: int, world: int, n: int, cu: tuple[int, ...]) -> tuple[int, ...]:
    """The real tokens of `rank` (see the module docstring), sorted."""
    if layout == "contiguous":
        return tuple(range(rank * n // world, (rank + 1) * n // world))
    if layout == "stripe":
        return tuple(range(rank, n, world))
    out: list[int] = []
    turn = 0  # the tail rotation, running on across documents
    for a, b in zip(cu, cu[1:], strict=False):
        c, tail = divmod(b - a, 2 * world)
        first, second = rank, 2 * world - 1 - rank
        out += range(a + first * c, a + (first + 1) * c)
        out += range(a + second * c, a + (second + 1) * c)
        start = a + 2 * world * c
        out += [start + j for j in range(tail) if (turn + j) % world == rank]
        turn = (turn + tail) % world
    return tuple(out)


def as_cu(cu_seqlens) -> tuple[int, ...] | None:
    """cu_seqlens (tensor, sequence or None) as a hashable tuple (or None)."""
    if cu_seqlens is None:
        return None
    return tuple(int(x) for x in (cu_seqlens.tolist() if isinstance(cu_seqlens, torch.Tensor)
                                  else cu_seqlens))


def positions(layout: str, rank: int, world: int, seq_len: int,
              cu_seqlens=None) -> torch.Tensor:
    """Token positions (sorted, int64) held by `rank`, in its local order; RoPE, labels and the
    masks use these. cu_seqlens: the global document boundaries (see the module docstring); with
    them, seq_len may exceed N = cu_seqlens[-1] (the padded length): padding positions follow."""
    return torch.tensor(_positions(layout, rank, world, seq_len,
                                   normal_cu(layout, world, seq_len, cu_seqlens)),
                        dtype=torch.long)


def shard(x: torch.Tensor, layout: str, rank: int, world: int, dim: int = 1,
          cu_seqlens=None) -> torch.Tensor:
    """The part of the full-sequence tensor x that `rank` holds."""
    idx = positions(layout, rank, world, x.shape[dim], cu_seqlens).to(x.device)
    return x.index_select(dim, idx)


def unshard(shards: list[torch.Tensor], layout: str, dim: int = 1,
            cu_seqlens=None) -> torch.Tensor:
    """Inverse of shard: reassemble the full sequence from every rank's shard (rank order)."""
    world = len(shards)
    seq_len = sum(t.shape[dim] for t in shards)
    stacked = torch.cat(shards, dim=dim)
    order = torch.cat([positions(layout, r, world, seq_len, cu_seqlens) for r in range(world)])
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(seq_len)
    return stacked.index_select(dim, inverse.to(stacked.device))


def sort_order(pos: torch.Tensor) -> torch.Tensor | None:
    """Permutation that sorts `pos`, or None when it is already sorted."""
    if pos.numel() < 2 or bool((pos[1:] > pos[:-1]).all()):
        return None
    return torch.argsort(pos)


# --------------------------------------------------------------------------------- block relations
@dataclass(frozen=True)
class Task:
    """One kernel call: queries [q0, q1) against keys [k0, k1) under `mask`. For mask 'band', row i
    of the block sees the block's keys j with band[0] <= j - i < band[1]."""

    q0: int
    q1: int
    k0: int
    k1: int
    mask: str
    band: tuple[int, int] | None = None


@dataclass(frozen=True)
class Relation:
    """Which keys a query sees: causal or not, inside its document (cu: the global boundaries, None
    for one document), within a window (None: unbounded). Hashable: plans are cached on it."""

    causal: bool = True
    cu: tuple[int, ...] | None = None
    window: int | None = None

    @property
    def plain(self) -> bool:
        """One document, no window: the classic full or causal relation."""
        return self.cu is None and self.window is None

    @property
    def full(self) -> bool:
        return self.plain and not self.causal

    def visible(self, q_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(first, last) visible key position per query, inclusive (last < first: none)."""
        if self.cu is None:
            start = torch.zeros_like(q_pos)
            end = torch.full_like(q_pos, 2 ** 62)
        else:  # padding positions (>= N) see nothing: first > last
            cu = torch.tensor(self.cu, dtype=torch.long)
            doc = (torch.searchsorted(cu, q_pos, right=True) - 1).clamp(max=len(self.cu) - 2)
            pad = q_pos >= self.cu[-1]
            start = torch.where(pad, q_pos + 1, cu[doc])
            end = torch.where(pad, torch.full_like(q_pos, -1), cu[doc + 1] - 1)
        last = torch.minimum(end, q_pos) if self.causal else end
        first = start
        if self.window is not None:
            first = torch.maximum(start, q_pos - self.window + 1)
            if not self.causal:
                last = torch.minimum(last, q_pos + self.window - 1)
        return first, last

    def pairs(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> int:
        """How many (query, key) pairs are visible (k_pos sorted)."""
        lo, hi = self.ranges(q_pos, k_pos)
        return int((hi - lo).clamp(min=0).sum())

    def ranges(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per query, the visible key indices [lo, hi) in sorted k_pos."""
        first, last = self.visible(q_pos.contiguous())
        k = k_pos.contiguous()
        lo = torch.searchsorted(k, first)
        hi = torch.searchsorted(k, last, right=True)
        return lo, torch.maximum(hi, lo)


def as_relation(relation: Relation | bool) -> Relation:
    return relation if isinstance(relation, Relation) else Relation(bool(relation))


def block_tasks(q_pos: torch.Tensor, k_pos: torch.Tensor,
                causal: Relation | bool = True) -> tuple[Task, ...]:
    """Kernel calls that compute attention of queries at q_pos over keys at k_pos under a relation
    (True/False: plain causal/full).

    k_pos must be sorted. Without `causal` the answer is one full block. Rows that see no key get
    no task (the caller leaves them at lse = -inf).
    """
    rel = as_relation(causal)
    sq, sk = q_pos.numel(), k_pos.numel()
    if rel.full:
        return (Task(0, sq, 0, sk, "full"),)
    if not rel.plain:
        return _range_tasks(*rel.ranges(q_pos, k_pos))
    counts = torch.searchsorted(k_pos.contiguous(), q_pos.contiguous(), right=True).tolist()
    tasks: list[Task] = []
    a0 = 0
    while a0 < sq:
        c0 = counts[a0]
        a1 = a0 + 1
        if a1 < sq and counts[a1] == c0 + 1:  # a diagonal run: row a sees keys [0, a + delta)
            while a1 < sq and counts[a1] == counts[a1 - 1] + 1:
                a1 += 1
            if c0 >= 1:
                if c0 > 1:
                    tasks.append(Task(a0, a1, 0, c0 - 1, "full"))
                tasks.append(Task(a0, a1, c0 - 1, c0 - 1 + (a1 - a0), "causal"))
            else:
                tasks.append(Task(a0, a1, 0, a1 - a0, "shifted"))
        else:  # a flat run: every row sees the same first c0 keys
            while a1 < sq and counts[a1] == c0:
                a1 += 1
            if c0 > 0:
                tasks.append(Task(a0, a1, 0, c0, "full"))
        a0 = a1
    return tuple(tasks)


def _range_tasks(lo: torch.Tensor, hi: torch.Tensor) -> tuple[Task, ...]:
    """Kernel calls for rows that see key indices [lo[a], hi[a]): runs of rows along which lo and
    hi each stay put or step by one; empty rows get nothing."""
    lo_l, hi_l = lo.tolist(), hi.tolist()
    n = len(lo_l)
    tasks: list[Task] = []
    a0 = 0
    while a0 < n:
        if hi_l[a0] <= lo_l[a0]:
            a0 += 1
            continue
        a1 = a0 + 1
        dl = dh = 0
        if a1 < n and hi_l[a1] > lo_l[a1]:
            dl, dh = lo_l[a1] - lo_l[a0], hi_l[a1] - hi_l[a0]
            if dl in (0, 1) and dh in (0, 1):
                while (a1 < n and hi_l[a1] > lo_l[a1] and lo_l[a1] - lo_l[a1 - 1] == dl
                       and hi_l[a1] - hi_l[a1 - 1] == dh):
                    a1 += 1
            else:
                dl = dh = 0
        tasks.extend(_run_tasks(a0, a1, lo_l[a0], hi_l[a0], dl, dh))
        a0 = a1
    return tuple(tasks)


def _run_tasks(a0: int, a1: int, lo: int, hi: int, dl: int, dh: int) -> list[Task]:
    """Row a0 + i sees keys [lo + dl*i, hi + dh*i), every row at least one."""
    rows = a1 - a0
    if dl == 0 and dh == 0:
        return [Task(a0, a1, lo, hi, "full")]
    if dl == 0:  # the upper edge steps: a full part and a causal triangle
        out = [Task(a0, a1, lo, hi - 1, "full")] if hi - 1 > lo else []
        return [*out, Task(a0, a1, hi - 1, hi - 1 + rows, "causal")]
    # the lower edge steps (a window): keys [lo, hi + dh*(rows-1)); row i sees j - i in [0, w)
    k1 = hi + dh * (rows - 1)
    width = hi - lo if dh else k1 - lo
    return [Task(a0, a1, lo, k1, "band", (0, width))]


@lru_cache(maxsize=4096)
def layout_tasks(layout: str, world: int, seq_len: int, q_rank: int, k_rank: int,
                 causal: Relation | bool) -> tuple[Task, ...]:
    """block_tasks for the shards of q_rank (queries) and k_rank (keys) in a layout, cached."""
    cu = as_relation(causal).cu
    return block_tasks(positions(layout, q_rank, world, seq_len, cu),
                       positions(layout, k_rank, world, seq_len, cu), causal)


def sees(q_pos: torch.Tensor, k_pos: torch.Tensor, causal: Relation | bool = True) -> bool:
    """Whether any query at q_pos sees any key at k_pos (k_pos in any order): exactly when
    `block_tasks` plans at least one kernel call for the pair."""
    rel = as_relation(causal)
    if q_pos.numel() == 0 or k_pos.numel() == 0:
        return False
    return rel.full or rel.pairs(q_pos, torch.sort(k_pos).values) > 0


@lru_cache(maxsize=256)
def layout_need(layout: str, world: int, seq_len: int, causal: Relation | bool,
                holders: tuple[tuple[int, ...], ...] | None = None
                ) -> tuple[tuple[bool, ...], ...]:
    """need[i][j]: whether the queries of holding i see any key of holding j, a holding being the
    shards of some ranks (`holders`; default: each rank its own shard). From the global relation,
    so every rank computes the same matrix; `route` skips the transfers it rules out."""
    cu = as_relation(causal).cu
    holders = holders or tuple((r,) for r in range(world))
    pos = [torch.cat([positions(layout, r, world, seq_len, cu) for r in h]) for h in holders]
    return tuple(tuple(sees(pos[q], pos[k], causal) for k in range(len(pos)))
                 for q in range(len(pos)))
