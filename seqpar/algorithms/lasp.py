"""A linear-attention layer's sequence parallelism: LASP-2 (one all-gather of states a layer) and
LASP-1 (a ring of states, rank after rank), over contiguous shards.

    lasp = Lasp(comm, mode="lasp2")               # the SP group's Comm (group rank = layout rank)
    st = lasp.stretch(s, cu_seqlens, width=3)     # this rank's tokens [lo, hi) and documents
    halo = lasp.halo(x, width)                    # the previous rank's last `width` rows of x
    o = lasp.delta_rule(q, k, v, g, beta, scale, st)

A rank's tokens map the state entering them affinely, S_out = A S_in + B (A: dk x dk a head, the
product of the tokens' decays and (I - beta k k^T); B: the state its tokens leave from zero), and
its outputs are o = o0 + reach S_in (o0: from a zero state). One pass of the delta rule with values
[0 | v] from the state [I | 0] gives all four: the final state is [A | B] (the rank's pair), the
outputs [reach | o0]. LASP-2 all-gathers the pairs and each rank applies the earlier ranks' pairs in
order to get its S_in; backward reduce-scatters the pairs' gradients (the all-gather's adjoint).
LASP-1 receives S_in from the previous rank, runs its tokens from it and sends S_out on; backward
passes dS back the same way. A stretch that begins a document takes no state: its pair has A = 0
and, under LASP-1, the state it receives is zeroed (and the gradient it returns is zero), so every
rank sends the same bytes whatever the documents: the count `rules.linear.lasp_bytes` gives.

The short convolution before the rule needs the `width` (kernel - 1) tokens before a rank's first:
one point-to-point message from the previous rank, its gradient returned in backward.
Only the contiguous layout (one stretch a rank) is taken: `rules.linear.check_lasp`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from seqpar.algorithms import ledger
from seqpar.algorithms.comm import Comm
from seqpar.algorithms.delta_rule import delta_rule
from seqpar.errors import require
from seqpar.rules import layouts
from seqpar.rules.linear import LASP_MODES, halo_gathered

HALO_TAG, STATE_TAG = 7101, 7102  # gloo matches by tag where NCCL's order is not emulated


@dataclass(frozen=True)
class Stretch:
    """This rank's tokens [lo, hi) of a call on n, and where documents start among them."""

    lo: int
    hi: int
    starts: tuple[int, ...]  # offsets in [0, hi - lo) where a document begins (0: a fresh start)
    first: int               # where the document of token lo begins (global)
    n: int

    @property
    def carries(self) -> bool:
        """Whether the state left by the earlier ranks enters this rank's first token."""
        return self.first < self.lo

    def doc_start(self, device: torch.device | None = None) -> torch.Tensor:
        """(hi - lo,) the global position where each token's document begins."""
        cuts = torch.tensor(sorted({self.first - self.lo, *self.starts}), dtype=torch.long)
        at = torch.searchsorted(cuts, torch.arange(self.hi - self.lo), right=True) - 1
        return (cuts[at] + self.lo).to(device)


class Lasp:
    """LASP on one SP group: `mode` lasp2 or lasp1, the rule's `backend` (delta_rule.BACKENDS)."""

    def __init__(self, comm: Comm, mode: str = "lasp2", backend: str = "auto"):
        require(mode in LASP_MODES, "linear_sp", mode, f"must be one of {', '.join(LASP_MODES)}")
        self.comm, self.mode, self.backend = comm, mode, backend
        self.world, self.rank = comm.size, comm.rank

    def stretch(self, s: int, cu_seqlens: Any = None) -> Stretch:
        """This rank's stretch of a call whose local shard holds s tokens; n from the documents
        (cu_seqlens [0, ..., n], the same on every rank) or s x world."""
        cu = layouts.as_cu(cu_seqlens)
        n = cu[-1] if cu else s * self.world
        docs = cu or (0, n)
        pos = layouts.positions("contiguous", self.rank, self.world, n, docs)
        lo, hi = pos[0], pos[-1] + 1
        require(hi - lo == s, "tokens", s, f"rank {self.rank} holds {hi - lo} of the n={n} tokens "
                f"in the contiguous layout")
        starts = tuple(c - lo for c in docs[:-1] if lo <= c < hi)
        first = max(c for c in docs[:-1] if c <= lo)
        return Stretch(lo, hi, starts, first, n)

    def halo(self, x: torch.Tensor, width: int, st: Stretch) -> torch.Tensor:
        """(b, width, c): the `width` rows of x (b, s, c) before this rank's first (zeros before
        the sequence): the previous rank's last rows, or, where shards are shorter than `width`,
        the earlier ranks' last rows all-gathered (`rules.linear.halo_gathered`)."""
        if width == 0 or self.world == 1:
            return x.new_zeros(x.shape[0], width, *x.shape[2:])
        if not halo_gathered(st.n, self.world, width):
            return _Halo.apply(x, self.comm, width)
        lengths = [len(layouts.positions("contiguous", r, self.world, st.n, (0, st.n)))
                   for r in range(self.world)]
        return _HaloGather.apply(x, self.comm, width, lengths)

    def delta_rule(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                   beta: torch.Tensor, scale: float, st: Stretch) -> torch.Tensor:
        """This rank's outputs of the gated delta rule over the whole call (`delta_rule.py`'s
        arguments for this rank's tokens)."""
        inner = [t for t in st.starts if t > 0]
        if self.world == 1:
            return delta_rule(q, k, v, g, beta, scale, None, inner, self.backend)[0]
        if self.mode == "lasp1":
            return self._lasp1(q, k, v, g, beta, scale, st, inner)
        return self._lasp2(q, k, v, g, beta, scale, st, inner)

    def _lasp2(self, q, k, v, g, beta, scale: float, st: Stretch, inner: list[int]
               ) -> torch.Tensor:
        b, s, h, dk = k.shape
        dv = v.shape[-1]
        acc = torch.promote_types(v.dtype, torch.float32)
        cut = (inner[0] if inner else s) if st.carries else 0
        outs = [v.new_zeros(b, 0, h, dk + dv)]
        eye = torch.eye(dk, dtype=acc, device=v.device).expand(b, h, dk, dk)
        pair = torch.cat([eye, eye.new_zeros(b, h, dk, dv)], dim=-1)  # no token: the identity
        if cut:  # the tokens the entering state reaches, from [I | 0] with values [0 | v]
            v0 = torch.cat([v.new_zeros(b, cut, h, dk), v[:, :cut]], dim=-1)
            o, pair = delta_rule(q[:, :cut], k[:, :cut], v0, g[:, :cut], beta[:, :cut], scale,
                                 pair, (), self.backend)
            outs.append(o)
        if cut < s:  # a document starts here: the state leaving owes nothing to the one entering
            o, last = delta_rule(*(t[:, cut:] for t in (q, k, v, g, beta)), scale, None,
                                 [t - cut for t in inner if t > cut], self.backend)
            pair = torch.cat([last.new_zeros(b, h, dk, dk), last], dim=-1)
            outs.append(torch.cat([o.new_zeros(*o.shape[:3], dk), o], dim=-1))
        o = torch.cat(outs, dim=1)
        return _Prefix.apply(o, pair, self.comm).to(v.dtype)

    def _lasp1(self, q, k, v, g, beta, scale: float, st: Stretch, inner: list[int]
               ) -> torch.Tensor:
        b, _, h, dk = k.shape
        acc = torch.promote_types(v.dtype, torch.float32)
        shape = (b, h, dk, v.shape[-1])
        state = _RecvState.apply(self.comm, shape, acc, st.carries, q, k, v, g, beta)
        o, last = delta_rule(q, k, v, g, beta, scale, state, inner, self.backend)
        return _SendState.apply(o, last, self.comm)


def _send_recv(comm: Comm, send: torch.Tensor | None, to: int, recv: torch.Tensor | None,
               frm: int, tag: int) -> None:
    """One exchange: `send` to group rank `to`, `recv` from `frm` (None or a rank off the group:
    that side is skipped)."""
    sends = [(send.contiguous(), to)] if send is not None and 0 <= to < comm.size else []
    recvs = [(recv, frm)] if recv is not None and 0 <= frm < comm.size else []
    if sends or recvs:
        comm.exchange(sends, recvs, tag=tag).wait()


class _Halo(torch.autograd.Function):
    """The previous rank's last rows of x; backward returns their gradient to it."""

    @staticmethod
    def forward(ctx, x, comm: Comm, width: int):
        ctx.comm, ctx.width, ctx.shape, ctx.ledgers = comm, width, x.shape, ledger.active()
        got = x.new_zeros(x.shape[0], width, *x.shape[2:])
        _send_recv(comm, x[:, -width:], comm.rank + 1, got, comm.rank - 1, HALO_TAG)
        return got

    @staticmethod
    def backward(ctx, grad):
        comm, width = ctx.comm, ctx.width
        back = grad.new_zeros(ctx.shape[0], width, *ctx.shape[2:])
        with ledger.backward_of(ctx.ledgers):
            _send_recv(comm, grad, comm.rank - 1, back, comm.rank + 1, HALO_TAG)
        dx = grad.new_zeros(ctx.shape)
        dx[:, -width:] = back
        return dx, None, None


class _HaloGather(torch.autograd.Function):
    """The `width` rows before this rank's first where a shard is shorter than that (the previous
    rank alone does not hold them): every rank's last rows (zeros before a short shard's first)
    all-gathered, the earlier ranks' taken in order; backward: their gradients reduce-scattered
    back to the ranks that hold them."""

    @staticmethod
    def forward(ctx, x, comm: Comm, width: int, lengths: list[int]):
        b, s = x.shape[:2]
        take = min(width, s)
        tail = x.new_zeros(b, width, *x.shape[2:])
        tail[:, width - take:] = x[:, s - take:]
        tails = comm.all_gather(tail.unsqueeze(0), dim=0)  # (P, b, width, c)
        rows = [(j, i) for j in range(comm.rank)
                for i in range(width - min(width, lengths[j]), width)][-width:]
        halo = x.new_zeros(b, width, *x.shape[2:])
        for at, (j, i) in enumerate(rows, start=width - len(rows)):
            halo[:, at] = tails[j, :, i]
        ctx.comm, ctx.rows, ctx.shape, ctx.ledgers = comm, rows, x.shape, ledger.active()
        return halo

    @staticmethod
    def backward(ctx, grad):
        width, s = grad.shape[1], ctx.shape[1]
        d = grad.new_zeros(ctx.comm.size, *grad.shape)
        for at, (j, i) in enumerate(ctx.rows, start=width - len(ctx.rows)):
            d[j, :, i] += grad[:, at]
        with ledger.backward_of(ctx.ledgers):
            mine = ctx.comm.reduce_scatter(d, dim=0)[0]
        take = min(width, s)
        dx = grad.new_zeros(ctx.shape)
        dx[:, s - take:] = mine[:, width - take:]
        return dx, None, None, None


def _entering(pairs: torch.Tensor, upto: int) -> list[torch.Tensor]:
    """The states after each of the first `upto` ranks (S_0 = 0, S_j+1 = A_j S_j + B_j)."""
    dk = pairs.shape[-2]
    states = [pairs.new_zeros(*pairs.shape[1:-1], pairs.shape[-1] - dk)]
    for j in range(upto):
        states.append(pairs[j, ..., :dk] @ states[-1] + pairs[j, ..., dk:])
    return states


class _Prefix(torch.autograd.Function):
    """LASP-2's communication and combination, one Function (its collectives in one fixed order on
    every rank, whichever rank's outputs need the entering state): every rank's pair gathered,
    S_in the earlier ranks' maps in order, out = o0 + reach S_in from out = [reach | o0];
    backward: the scan's adjoint, the pairs' gradients summed over the ranks (a reduce-scatter)."""

    @staticmethod
    def forward(ctx, out, pair, comm: Comm):
        ctx.comm, ctx.ledgers, ctx.dtypes = comm, ledger.active(), (out.dtype, pair.dtype)
        dk = pair.shape[-2]
        pairs = comm.all_gather(pair.unsqueeze(0).contiguous(), dim=0)
        state = _entering(pairs, comm.rank)[-1]
        reach = out[..., :dk].to(pair.dtype)
        ctx.save_for_backward(reach, pairs)
        return out[..., dk:].to(pair.dtype) + torch.einsum("bthk,bhkv->bthv", reach, state)

    @staticmethod
    def backward(ctx, grad):
        reach, pairs = ctx.saved_tensors
        rank, dk = ctx.comm.rank, pairs.shape[-2]
        grad = grad.to(pairs.dtype)
        states = _entering(pairs, rank)
        d_reach = torch.einsum("bthv,bhkv->bthk", grad, states[-1])
        g = torch.einsum("bthk,bthv->bhkv", reach, grad)  # dL/dS_in
        d_pairs = torch.zeros_like(pairs)
        for j in reversed(range(rank)):
            d_pairs[j, ..., dk:] = g
            d_pairs[j, ..., :dk] = g @ states[j].transpose(-1, -2)
            g = pairs[j, ..., :dk].transpose(-1, -2) @ g
        with ledger.backward_of(ctx.ledgers):
            d_pair = ctx.comm.reduce_scatter(d_pairs, dim=0)[0]
        d_out = torch.cat([d_reach, grad], dim=-1).to(ctx.dtypes[0])
        return d_out, d_pair.to(ctx.dtypes[1]), None


class _RecvState(torch.autograd.Function):
    """The state entering this rank, from the previous one (zeros where a document starts here or
    on rank 0); backward sends its gradient back (zeros where the state did not enter). q, k, v,
    g and beta only tie the node into the graph, so its backward always runs and every rank sends
    alike."""

    @staticmethod
    def forward(ctx, comm: Comm, shape, dtype, carries: bool, *anchors):
        ctx.comm, ctx.carries, ctx.ledgers = comm, carries, ledger.active()
        ctx.anchors = len(anchors)
        state = torch.zeros(shape, dtype=dtype, device=anchors[0].device)
        _send_recv(comm, None, -1, state, comm.rank - 1, STATE_TAG)
        return state if carries else state.zero_()

    @staticmethod
    def backward(ctx, grad):
        comm = ctx.comm
        with ledger.backward_of(ctx.ledgers):
            send = grad if ctx.carries else torch.zeros_like(grad)
            _send_recv(comm, send, comm.rank - 1, None, -1, STATE_TAG)
        return (None, None, None, None, *([None] * ctx.anchors))


class _SendState(torch.autograd.Function):
    """o unchanged; sends the state leaving this rank to the next; backward receives its
    gradient from there."""

    @staticmethod
    def forward(ctx, o, last, comm: Comm):
        ctx.comm, ctx.ledgers = comm, ledger.active()
        ctx.like = (last.shape, last.dtype, last.device)
        _send_recv(comm, last, comm.rank + 1, None, -1, STATE_TAG)
        return o.view_as(o)

    @staticmethod
    def backward(ctx, grad):
        comm = ctx.comm
        shape, dtype, device = ctx.like
        back = torch.zeros(shape, dtype=dtype, device=device)
        with ledger.backward_of(ctx.ledgers):
            _send_recv(comm, None, -1, back, comm.rank + 1, STATE_TAG)
        return grad, back, None
