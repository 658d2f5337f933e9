"""Blockwise attention: run a (query block, key block) pair as the kernel calls `layouts` plans.

Forward merges each call into (out, lse) accumulators with the online softmax; backward adds each
call's gradients into dq, dk, dv accumulators. Every ring-like algorithm is a loop over these two.

On the flash backend (flash-attn >= 2.6 on CUDA) a block's tasks run as few flash-attn varlen calls
as their masks allow (`plan`): tasks share a call when one window_size computes each of them exactly
(`kernels.window_sides`: full tasks with full ones, square causal ones with causal ones, and both
with a window's bands where they fit inside the window; a 'shifted' task is causal one row down) and
their query rows do not overlap, so every row of a call's output comes from one sequence and merges
into the accumulator once. (A layout plans at most one task of each mask per run of rows; a full
and a causal task of one run share rows and go to different calls.) Sequence boundaries and row
indices are built on the device once per (plan, shape, device) and cached. A group of one task runs
as its own dense call, and every other backend keeps one kernel call per task. FLOPs are booked per
task either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate

import torch

from seqpar.algorithms import kernels
from seqpar.algorithms.kernels.tensors import seq_rows
from seqpar.algorithms.layouts import Task
from seqpar.algorithms.softmax_merge import empty_partial, merge, merge_into

NO_WINDOW = (-1, -1)


def new_partial(q: torch.Tensor, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) accumulators for queries q that have seen no key; out `width` wide (V's head
    dim; None: q's)."""
    work = kernels.acc_dtype(q.dtype)
    return empty_partial(q, work, work, width)


def zeros_acc(t: torch.Tensor) -> torch.Tensor:
    """A gradient accumulator shaped like t, in the accumulation dtype."""
    return torch.zeros(t.shape, dtype=kernels.acc_dtype(t.dtype), device=t.device)


class Seen:
    """The query rows of fresh accumulators (out = 0, lse = -inf: `new_partial`) that a merge has
    written so far. A call whose rows none has written yet is copied into them, not merged: the
    merge would compute exactly the copy (w_acc = exp(-inf) = 0, w_new = exp(lse - lse) = 1), in
    seven more operations."""

    def __init__(self) -> None:
        self.spans: list[tuple[int, int]] = []

    def first(self, a: int, c: int) -> bool:
        """Whether rows [a, c) are written for the first time (and mark them written)."""
        fresh = all(c <= s0 or a >= s1 for s0, s1 in self.spans)
        self.spans.append((a, c))
        return fresh


def _into(acc_out: torch.Tensor, acc_lse: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
          first: bool) -> None:
    """Merge (out, lse) into accumulator rows, or copy it there when they hold nothing yet."""
    if first:
        acc_out.copy_(out)
        acc_lse.copy_(lse)
    else:
        merge_into(acc_out, acc_lse, out, lse)


def forward_tasks(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tasks: Sequence[Task],
    acc_out: torch.Tensor, acc_lse: torch.Tensor, backend: str, scale: float | None,
    seen: Seen | None = None,
) -> None:
    """Merge attention of q over (k, v), as planned by `tasks`, into the accumulators. `seen`:
    the rows already written, when the accumulators started empty (None: merge every call)."""
    groups, singles, packed = _calls(q, tasks, backend)
    for group in groups:
        out, lse, rows = _group_forward(q, k, v, group, scale, packed)
        fresh = [seen.first(q0, q1) for q0, q1, _, _ in group.spans] if seen is not None else []
        _merge_rows(acc_out, acc_lse, out, lse, rows, q.shape[0],
                    bool(fresh) and all(fresh) and rows.span is not None)
    for t in singles:
        out, lse = kernels.attend(seq_rows(q, t.q0, t.q1), seq_rows(k, t.k0, t.k1),
                                  seq_rows(v, t.k0, t.k1), t.mask, backend=backend, scale=scale,
                                  band=t.band)
        _into(seq_rows(acc_out, t.q0, t.q1), acc_lse.narrow(2, t.q0, t.q1 - t.q0), out, lse,
              seen is not None and seen.first(t.q0, t.q1))


def backward_tasks(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    out: torch.Tensor, lse: torch.Tensor, tasks: Sequence[Task],
    dq: torch.Tensor | None, dk: torch.Tensor | None, dv: torch.Tensor | None,
    backend: str, scale: float | None,
) -> None:
    """Add the gradients of the planned kernel calls into dq, dk, dv (any may be None)."""
    groups, singles, packed = _calls(q, tasks, backend)
    b, _, h, d = q.shape
    for group in groups:
        seqs, q_rows, k_rows = _packing(group, b, q.shape[1], k.shape[1], q.device)
        for t in group.tasks:
            kernels.book_flops(b, t.q1 - t.q0, t.k1 - t.k0, h, d, t.mask, t.band, backward=True,
                               v_dim=v.shape[-1])
        gq, gk, gv = kernels.VARLEN_BACKWARD[packed](
            _take(dout, q_rows), _take(q, q_rows), _take(k, k_rows), _take(v, k_rows),
            _take(out, q_rows), _take(lse.transpose(1, 2), q_rows).t(), seqs, group.causal,
            group.window, kernels.default_scale(scale, d))
        _add_rows(dq, gq, q_rows, b)
        _add_rows(dk, gk, k_rows, b)
        _add_rows(dv, gv, k_rows, b)
    for t in singles:
        gq, gk, gv = kernels.attend_backward(
            seq_rows(dout, t.q0, t.q1), seq_rows(q, t.q0, t.q1), seq_rows(k, t.k0, t.k1),
            seq_rows(v, t.k0, t.k1), seq_rows(out, t.q0, t.q1), lse.narrow(2, t.q0, t.q1 - t.q0),
            t.mask, backend=backend, scale=scale, band=t.band)
        # add_ on a narrowed view: `acc[:, a:b] += g` would also copy the view onto itself
        for acc, g, a, c in ((dq, gq, t.q0, t.q1), (dk, gk, t.k0, t.k1), (dv, gv, t.k0, t.k1)):
            if acc is not None:
                seq_rows(acc, a, c).add_(g)


# ------------------------------------------------------------------------- varlen groups (flash)
@dataclass(frozen=True)
class Group:
    """Tasks that run as one flash-attn varlen call: `spans` (q0, q1, k0, k1) are its sequences in
    order, their query rows increasing and disjoint; `tasks` the layout tasks they compute."""

    causal: bool
    window: tuple[int, int]
    spans: tuple[tuple[int, int, int, int], ...]
    tasks: tuple[Task, ...]


@dataclass(frozen=True)
class _Rows:
    """Where a group's packed rows sit in a (B, S, ...) tensor, batch-major then sequence by
    sequence: a `span` [a, c) of every batch row that the sequences tile in order (a narrow, no
    copy), else index tensors: `flat` = b*S + r (gathers), `b` and `r` (scatters)."""

    span: tuple[int, int] | None
    flat: torch.Tensor | None = None
    b: torch.Tensor | None = None
    r: torch.Tensor | None = None


def _sequence(t: Task) -> tuple[tuple[int, int, int, int], kernels.Side, kernels.Side] | None:
    """(span, left side, right side) of the varlen sequence that computes task t (see
    `kernels.window_sides`); None when no row of t sees a key (a one-row 'shifted' task)."""
    if t.mask == "shifted":  # query i sees keys j < i: rows 1.. over keys ..s-1, causal
        sq = t.q1 - t.q0
        return _sequence(Task(t.q0 + 1, t.q1, t.k0, t.k0 + sq - 1, "causal")) if sq > 1 else None
    sq, sk = t.q1 - t.q0, t.k1 - t.k0
    if t.mask == "causal" and sq != sk:  # flash aligns causal bottom-right: square blocks only
        raise ValueError(f"flash backend: a causal block must be square, got Sq={sq} Sk={sk}")
    band = {"full": (1 - sq, sk), "causal": (1 - sq, 1)}.get(t.mask, t.band)
    if band is None:
        raise ValueError(f"unknown mask {t.mask!r}")
    return (t.q0, t.q1, t.k0, t.k1), *kernels.window_sides(sq, sk, band)


def _join(side: kernels.Side, other: kernels.Side) -> kernels.Side | None:
    """One window side that serves both (see `kernels.window_sides`), or None."""
    if side[0] is not None and other[0] is not None and side[0] != other[0]:
        return None
    value = side[0] if side[0] is not None else other[0]
    least = max(side[1], other[1])
    return None if value is not None and value < least else (value, least)


@lru_cache(maxsize=4096)
def plan(tasks: tuple[Task, ...]) -> tuple[tuple[Group, ...], tuple[Task, ...]]:
    """(varlen groups of two or more sequences, tasks left to one kernel call each). A task joins
    the first group whose window it can share and whose query rows end before its own begin;
    otherwise it opens a group."""
    open_: list[list] = []  # [left side, right side, last query row, [(span, task), ...]]
    singles: list[Task] = []
    for t in tasks:
        found = _sequence(t)
        if found is None:
            singles.append(t)
            continue
        span, left, right = found
        for g in open_:
            joined = (_join(g[0], left), _join(g[1], right))
            if g[2] <= span[0] and None not in joined:
                g[0], g[1], g[2] = *joined, span[1]
                g[3].append((span, t))
                break
        else:
            open_.append([left, right, span[1], [(span, t)]])
    groups: list[Group] = []
    for left, right, _, members in open_:
        if len(members) == 1:
            singles.append(members[0][1])
            continue
        window = (-1 if left[0] is None else left[0], -1 if right[0] is None else right[0])
        causal = window == (-1, 0)  # flash's causal: what window (-1, 0) means
        groups.append(Group(causal, NO_WINDOW if causal else window,
                            tuple(s for s, _ in members), tuple(t for _, t in members)))
    return tuple(groups), tuple(singles)


def _calls(q: torch.Tensor, tasks: Sequence[Task], backend: str
           ) -> tuple[tuple[Group, ...], Sequence[Task], str | None]:
    """The varlen groups and single calls of a block, and the kernel that runs the groups: grouped
    where a FlashAttention-2 kernel takes packed sequences (torch's flash kernel; flash-attn where
    it takes the packed lse), one call per task elsewhere."""
    kernel = kernels.kernel_of(backend, q.device, q.dtype, head_dim=q.shape[-1])
    packed = kernels.window_kernel(kernel, q.device, q.dtype, q.shape[-1])
    if packed == "flash-attn" and not kernels.flash_varlen_supported():
        packed = None
    return (*plan(tuple(tasks)), packed) if packed else ((), tasks, None)


@lru_cache(maxsize=256)
def _packing(group: Group, batch: int, sq: int, sk: int, device: torch.device
             ) -> tuple[kernels.Varlen, _Rows, _Rows]:
    """The group's sequence boundaries and row indices for a (batch, sq) x (batch, sk) block on
    `device`: built once, so a call copies nothing from the host."""
    q_len = [q1 - q0 for q0, q1, _, _ in group.spans] * batch
    k_len = [k1 - k0 for _, _, k0, k1 in group.spans] * batch

    def cu(lengths: list[int]) -> torch.Tensor:
        return torch.tensor([0, *accumulate(lengths)], dtype=torch.int32, device=device)

    seqs = kernels.Varlen(cu(q_len), cu(k_len), max(q_len), max(k_len))
    return (seqs, _rows([(s[0], s[1]) for s in group.spans], batch, sq, device),
            _rows([(s[2], s[3]) for s in group.spans], batch, sk, device))


def _rows(ranges: list[tuple[int, int]], batch: int, s: int, device: torch.device) -> _Rows:
    if all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False)):
        return _Rows((ranges[0][0], ranges[-1][1]))
    r = torch.cat([torch.arange(a, c) for a, c in ranges])
    b = torch.arange(batch).repeat_interleave(r.numel())
    r = r.repeat(batch)
    return _Rows(None, (b * s + r).to(device), b.to(device), r.to(device))


def _take(t: torch.Tensor, rows: _Rows) -> torch.Tensor:
    """The packed rows (n, ...) of t (B, S, ...)."""
    if rows.span is not None:
        a, c = rows.span
        return t.narrow(1, a, c - a).flatten(0, 1)
    return t.flatten(0, 1).index_select(0, rows.flat)


def _group_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Group,
                   scale: float | None, packed: str) -> tuple[torch.Tensor, torch.Tensor, _Rows]:
    """One varlen call on kernel `packed`: (out (n, H, D), lse (H, n), where its rows go)."""
    b, sq, h, d = q.shape
    seqs, q_rows, k_rows = _packing(group, b, sq, k.shape[1], q.device)
    for t in group.tasks:
        kernels.book_flops(b, t.q1 - t.q0, t.k1 - t.k0, h, d, t.mask, t.band, v_dim=v.shape[-1])
    out, lse = kernels.VARLEN_FORWARD[packed](_take(q, q_rows), _take(k, k_rows), _take(v, k_rows),
                                              seqs, group.causal, group.window,
                                              kernels.default_scale(scale, d))
    return out, lse, q_rows


def _merge_rows(acc_out: torch.Tensor, acc_lse: torch.Tensor, out: torch.Tensor,
                lse: torch.Tensor, rows: _Rows, batch: int, first: bool = False) -> None:
    """Merge a call's packed (out, lse) into the accumulators' rows (each row once); `first`: a
    span of rows nothing has written yet, copied."""
    if rows.span is not None:
        a, c = rows.span
        _into(acc_out.narrow(1, a, c - a), acc_lse.narrow(2, a, c - a),
              out.view(batch, c - a, *out.shape[1:]),
              lse.view(lse.shape[0], batch, c - a).transpose(0, 1), first)
        return
    lse_rows = acc_lse.transpose(1, 2)  # (B, S, H): rows first, a view
    new_out, new_lse = merge(_take(acc_out, rows).unsqueeze(0),
                             _take(lse_rows, rows).t().unsqueeze(0),
                             out.to(acc_out.dtype).unsqueeze(0), lse.to(acc_lse.dtype).unsqueeze(0))
    acc_out.index_put_((rows.b, rows.r), new_out.squeeze(0))
    lse_rows.index_put_((rows.b, rows.r), new_lse.squeeze(0).t())


def _add_rows(acc: torch.Tensor | None, grad: torch.Tensor, rows: _Rows, batch: int) -> None:
    """Add a call's packed gradient into the accumulator's rows (a key row may recur: summed)."""
    if acc is None:
        return
    if rows.span is not None:
        a, c = rows.span
        acc.narrow(1, a, c - a).add_(grad.view(batch, c - a, *grad.shape[1:]))
    else:
        acc.index_put_((rows.b, rows.r), grad.to(acc.dtype), accumulate=True)


def pack_kv(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One contiguous buffer (B, s, Hkv, D + Dv), each head's K then its V, so that K and V travel
    in one message (and gather, permute and reduce-scatter along the token dim, and split by
    heads, as one tensor) whether or not V has K's width (MLA's does not)."""
    return torch.cat([k, v], dim=3).contiguous()


def unpack_kv(kv: torch.Tensor, head_dim: int, dense: bool = True
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """K (`head_dim` wide: the queries') and V of a packed buffer, each a dense tensor of its own
    (dense=False: views of the buffer, for a caller that copies them anyway).

    Views of the packed buffer would not be dense (K's and V's values sit side by side per
    head); torch's CPU flash kernel read such K,V 22% slower forward
    on a busy host, 1-5% on a quiet one (N = 4096, H = 8, D = 64; `benchmarks/hot_loops.py`), and
    the copy costs ~1% of that forward. One copy per block, made here, serves every task of the
    block; `tests/unit/test_hot_path.py` holds the kernel's K,V strides to `local`'s."""
    k, v = kv.split((head_dim, kv.shape[3] - head_dim), dim=3)
    if not dense:
        return k, v
    return kernels.contiguous(k), kernels.contiguous(v)


# the kernels that expand GQA's K,V heads to the query heads themselves (a new, dense tensor per
# call) on every path a task takes: bands and shifted blocks included
_EXPANDING = ("torch-cpu-flash", "torch-efficient", "math")


def kv_of(kv: torch.Tensor, q: torch.Tensor, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of a packed block as queries q's kernel calls read them: views where the kernel
    expands GQA heads into a dense copy anyway (`unpack_kv`'s copy would be a second one), dense
    copies otherwise."""
    heads, kv_heads = q.shape[2], kv.shape[2]
    expands = heads != kv_heads and kernels.kernel_of(
        backend, q.device, q.dtype, head_dim=q.shape[-1]) in _EXPANDING
    return unpack_kv(kv, q.shape[-1], dense=not expands)


def attend_tasks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tasks: Sequence[Task],
                 backend: str, scale: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of q over (k, v) as planned. One call that covers every query row returns the
    kernel's result as it is (no accumulator, no merge); otherwise the calls are merged."""
    if len(tasks) == 1 and tasks[0].q0 == 0 and tasks[0].q1 == q.shape[1]:
        t = tasks[0]
        out, lse = kernels.attend(q, k[:, t.k0:t.k1], v[:, t.k0:t.k1], t.mask, backend=backend,
                                  scale=scale, band=t.band)
        return out, lse.to(kernels.acc_dtype(q.dtype))
    groups, singles, packed = _calls(q, tasks, backend)
    if len(groups) == 1 and not singles:
        out, lse, rows = _group_forward(q, k, v, groups[0], scale, packed)
        b, s, h, _ = q.shape
        if rows.span == (0, s):  # one varlen call made every row
            lse = kernels.contiguous(lse.view(h, b, s).transpose(0, 1))
            return out.view(b, s, h, -1), lse.to(kernels.acc_dtype(q.dtype))
        acc_out, acc_lse = new_partial(q, v.shape[-1])
        _merge_rows(acc_out, acc_lse, out, lse, rows, b, rows.span is not None)
        return acc_out.to(q.dtype), acc_lse
    acc_out, acc_lse = new_partial(q, v.shape[-1])
    forward_tasks(q, k, v, tasks, acc_out, acc_lse, backend, scale, Seen())
    return acc_out.to(q.dtype), acc_lse


def grads_tasks(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                out: torch.Tensor, lse: torch.Tensor, tasks: Sequence[Task], backend: str,
                scale: float | None, packed: bool = False) -> tuple[torch.Tensor, ...]:
    """(dq, dk, dv) of the planned calls, or with `packed` (dq, dK,dV packed as `pack_kv`). One
    call over all of q and k returns the kernel's gradients as they are; otherwise they are summed
    in the accumulation dtype (packed: into the two halves of one buffer, no concatenation)."""
    if len(tasks) == 1 and (tasks[0].q0, tasks[0].q1, tasks[0].k0, tasks[0].k1) == (
            0, q.shape[1], 0, k.shape[1]):
        dq, dk, dv = kernels.attend_backward(dout, q, k, v, out, lse, tasks[0].mask,
                                             backend=backend, scale=scale, band=tasks[0].band)
        return (dq, pack_kv(dk, dv)) if packed else (dq, dk, dv)
    dq = zeros_acc(q)
    if packed:
        dkv = torch.zeros((*k.shape[:3], k.shape[3] + v.shape[3]),
                          dtype=kernels.acc_dtype(k.dtype), device=k.device)
        dk, dv = unpack_kv(dkv, k.shape[3], dense=False)
    else:
        dk, dv = zeros_acc(k), zeros_acc(v)
    backward_tasks(dout, q, k, v, out, lse, tasks, dq, dk, dv, backend, scale)
    return (dq, dkv) if packed else (dq, dk, dv)


def permute(t: torch.Tensor, index: torch.Tensor | None, dim: int = 1) -> torch.Tensor:
    """t reordered along dim by index (None: as it is)."""
    return t if index is None else t.index_select(dim, index)
