"""What every distributed attention shares: its shape, its rules, its mesh and one autograd shell.

An algorithm is a subclass of `Algorithm` with a typed `Options` class, a `grid` (its rank grid, see
mesh.py), its rules and analytic bytes (class methods: no process group needed), and a `forward` /
`backward` pair that reads like its paper's algorithm box:

    forward(q, k, v)            -> (out, tensors to save for backward, other state)
    backward(dout, saved, state) -> (dq, dk, dv, dsinks)

`_Shell`, the one `torch.autograd.Function`, does the rest for every algorithm: it saves tensors
through `save_for_backward` (so saved-tensor hooks and activation meters see them), books backward
communication into the ledgers that were active in forward, and casts gradients to the inputs' dtypes.
A call's attention sinks (`sinks`, one logit per query head, or None) ride on its algorithm copy:
an algorithm applies them once where its queries' lse is final (`sink`) and undoes them first in
backward (`unsink`, which gives this rank's partial dsinks; None without sinks).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from seqpar.algorithms import kernels, layouts, ledger
from seqpar.algorithms.mesh import Mesh
from seqpar.algorithms.softmax_merge import add_sink, sink_backward
from seqpar.errors import require
from seqpar.rules import masks
from seqpar.rules.algorithms.base import Geometry, Rules, call_relation
from seqpar.rules.blocks import rank_positions
from seqpar.rules.options import Options
from seqpar.rules.shape import AttnShape, check_shape, divides  # noqa: F401 (also from here)

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16,
          "float16": torch.float16}


Mask = Geometry  # the name the callers outside algorithms used before masks.Mask existed


class Algorithm(Rules):
    """A distributed attention (see the module docstring): its rules (`Rules`, class level, in
    seqpar.rules.algorithms) and the forward and backward that run them. Built by
    `build_attention`."""

    takes_sinks: ClassVar[bool] = False  # seqpar's own set it (a peer's code adds no sink)
    sinks: torch.Tensor | None = None  # the call's attention sinks (H,), set by `for_call`

    def __init__(self, mesh: Mesh, causal: bool, layout: str, options: Options,
                 window: int | None = None, mask: masks.Mask | None = None):
        self.mesh, self.causal, self.layout, self.options = mesh, causal, layout, options
        self.window, self.mask = window, mask
        # which keys a query sees: documents arrive per call, so each call runs on its own shallow
        # copy of the algorithm holding that call's relation (`for_call`); nothing shared is
        # rewritten, and overlapping calls (another layer's backward on autograd's thread, a
        # recomputed forward) each see their own
        self.relation = layouts.Relation(causal, None, window)
        self.comm = mesh.comm("sp")
        self.world, self.rank = self.comm.size, self.comm.rank  # the sequence-parallel group

    def for_call(self, relation: layouts.Relation,
                 sinks: torch.Tensor | None = None) -> Algorithm:
        """This algorithm for one call whose queries see keys by `relation` and whose softmax
        denominators hold `sinks` (a shallow copy: the mesh, options and caches are shared; the
        relation and the sinks are the call's own)."""
        call = copy.copy(self)
        call.relation, call.sinks = relation, None if sinks is None else sinks.detach()
        return call

    def sink(self, out: torch.Tensor, lse: torch.Tensor, heads: slice = slice(None)
             ) -> torch.Tensor:
        """out with the call's sinks (query heads `heads` of them: a head shard's) in the softmax
        denominators, for queries whose (out, lse) is final over every key; as it is without."""
        return out if self.sinks is None else add_sink(out, lse, self.sinks[heads])

    def unsink(self, dout: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
               heads: slice = slice(None)) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(the dout the attention's own backward takes, this rank's dsinks over every head:
        zero for heads it does not hold) for `sink`'s out; (dout, None) without sinks."""
        if self.sinks is None:
            return dout, None
        dout, part = sink_backward(dout, out, lse, self.sinks[heads])
        dsinks = part.new_zeros(self.sinks.shape)
        dsinks[heads] = part
        return dout, dsinks

    # -- the rank's own work -----------------------------------------------------------------------
    @property
    def backend(self) -> str:
        return self.options.backend

    @property
    def scale(self) -> float | None:
        return self.options.scale

    def grad_dtype(self, like: torch.Tensor) -> torch.dtype:
        """The dtype in which gradients that are summed elsewhere travel."""
        if self.options.grad_dtype == "accumulate":
            return kernels.acc_dtype(like.dtype)
        return like.dtype

    def forward(self, q: torch.Tensor, k: torch.Tensor,
                v: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...], Any]:
        raise NotImplementedError

    def backward(self, dout: torch.Tensor, saved: tuple[torch.Tensor, ...], state: Any
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        raise NotImplementedError


class _Shell(torch.autograd.Function):
    """The one autograd Function: every algorithm's forward and backward run inside it."""

    @staticmethod
    def forward(ctx, algo: Algorithm, q, k, v, sinks):  # sinks: algo.sinks' tensor, for its grad
        out, saved, state = algo.forward(q, k, v)
        ctx.algo, ctx.state, ctx.ledgers = algo, state, ledger.active()
        ctx.dtypes = (q.dtype, k.dtype, v.dtype, None if sinks is None else sinks.dtype)
        ctx.save_for_backward(*saved)
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, dout):
        return (None, *algorithm_backward(ctx, dout))


def algorithm_backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    """(dq, dk, dv, dsinks) of an autograd Function whose forward kept the algorithm, its state,
    the active ledgers, the dtypes of q, k, v and the sinks (None: no sinks) and the saved tensors
    on `ctx` (`_Shell`, and the model's checkpointing modes that run an algorithm themselves)."""
    saved, state = ctx.saved_tensors, ctx.state
    ctx.state = None
    # autograd may run backward on another thread (CUDA), where forward's context is not set
    with ledger.backward_of(ctx.ledgers):
        dq, dk, dv, *dsinks = ctx.algo.backward(dout.contiguous(), saved, state)  # a peer: 3
    grads = tuple(g.to(dt) for g, dt in zip((dq, dk, dv), ctx.dtypes[:3], strict=True))
    sink_dtype = ctx.dtypes[3]
    return (*grads, None if sink_dtype is None else dsinks[0].to(sink_dtype))


def check_sinks(algo: Algorithm, q: torch.Tensor, sinks: torch.Tensor | None) -> None:
    """A call's sinks: one float per query head of q, on q's device, for an algorithm that adds
    them."""
    if sinks is None:
        return
    require(type(algo).takes_sinks, "sinks", algo.name, "this attention adds no sinks "
            "(seqpar's own algorithms do)")
    require(isinstance(sinks, torch.Tensor) and sinks.is_floating_point()
            and tuple(sinks.shape) == (q.shape[2],), "sinks.shape",
            tuple(getattr(sinks, "shape", ())),
            f"must be one float per query head: ({q.shape[2]},)")
    require(sinks.device == q.device, "sinks.device", str(sinks.device),
            f"must be q's device {q.device}")


def shape_of(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, world: int) -> AttnShape:
    """Validate local shards (batch, seq, heads, head_dim) and return the global shape (v may be
    of a width of its own: MLA's v_head_dim)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        require(t.dim() == 4, f"{name}.shape", tuple(t.shape),
                "must be (batch, seq, heads, head_dim)")
    require(k.shape[:3] == v.shape[:3], "v.shape", tuple(v.shape),
            f"must match k.shape {tuple(k.shape)} in batch, seq and heads (its head_dim is its own)")
    require(q.shape[0] == k.shape[0] and q.shape[1] == k.shape[1] and q.shape[3] == k.shape[3],
            "k.shape", tuple(k.shape),
            f"must match q.shape {tuple(q.shape)} in batch, seq and head_dim")
    require(q.dtype == k.dtype == v.dtype, "k.dtype", str(k.dtype),
            f"q, k and v must share one dtype (q is {q.dtype})")
    require(q.dtype in DTYPES.values(), "q.dtype", str(q.dtype),
            f"must be one of {', '.join(DTYPES)}")
    return AttnShape(q.shape[0], q.shape[1] * world, q.shape[2], k.shape[2], q.shape[3],
                     q.element_size(), None if v.shape[3] == q.shape[3] else v.shape[3])


class Attention:
    """A built distributed attention: call it on local shards q, k, v (bshd) -> local out."""

    def __init__(self, algo: Algorithm):
        self.algo = algo

    @property
    def name(self) -> str:
        return self.algo.name

    @property
    def mesh(self) -> Mesh:
        return self.algo.mesh

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                 cu_seqlens: torch.Tensor | Sequence[int] | None = None,
                 mask: masks.Mask | None = None,
                 sinks: torch.Tensor | None = None) -> torch.Tensor:
        """out for this rank's shards. cu_seqlens: the global document boundaries [0, ..., N]
        (int64, the same on every rank; shards dealt by `layouts.shard(..., cu_seqlens=)`). mask:
        what every query sees (a `masks.Mask` of N tokens, the same on every rank; it takes the
        place of causal, window and cu_seqlens, and of the mask the attention was built with;
        shards dealt by `layouts.shard(..., mask=)`). sinks: gpt-oss's attention sinks, a learned
        logit per query head (heads,) in every query's softmax denominator once (its column
        dropped); their gradient is this rank's part (sum it over the group, as every weight's)."""
        shape = shape_of(q, k, v, self.algo.world)
        return self.run(shape, (q, k, v), lambda a, *ts: _Shell.apply(a, *ts, sinks), cu_seqlens,
                        mask, sinks)

    def run(self, shape: AttnShape, tensors: Sequence[torch.Tensor],
            apply: Callable[..., torch.Tensor], cu_seqlens: torch.Tensor | Sequence[int] | None,
            mask: masks.Mask | None, sinks: torch.Tensor | None) -> torch.Tensor:
        """apply(the algorithm for this call, *tensors) on this rank's shards `tensors` (q first,
        each (batch, seq, ...)) of a call on `shape`: the call's rules checked, its relation set,
        uneven shards padded to the common length and the output cut back (`__call__`, and MLA's
        latent call with q and the latent)."""
        a, q = self.algo, tensors[0]
        check_sinks(a, q, sinks)
        mask = mask if mask is not None else a.mask
        cu = layouts.as_cu(cu_seqlens)
        if mask is not None:
            require(cu is None, "cu_seqlens", list(cu or ()),
                    "must be None with a mask (masks.documents carries documents)")
            shape = replace(shape, seq_len=mask.n)
            cu = layouts.call_cu(a.world, mask.n, mask.cu)
        elif cu is not None:  # N from the documents: shards may be uneven (padded to ceil(N/P))
            shape = replace(shape, seq_len=cu[-1])
        if cu is not None:
            cu = layouts.normal_cu(a.layout, a.world, shape.seq_len, cu)
        type(a).check(shape, a.world, a.layout, a.causal, a.options, cu)
        kernels.resolve_backend(a.backend, q.device, q.dtype,
                                head_dim=max(shape.head_dim, shape.v_dim))
        relation = call_relation(a.layout, a.world, shape.seq_len, a.causal, cu, a.window, mask)
        a = a.for_call(relation, sinks)
        held = len(rank_positions(a.layout, a.rank, a.world, shape.seq_len, relation))
        if cu is None and held == q.shape[1]:
            return apply(a, *tensors)
        require(q.shape[1] == held, "q.shape", tuple(q.shape),
                f"rank {a.rank} holds {held} of the N={shape.seq_len} tokens in the {a.layout} "
                f"layout (layouts.shard with cu_seqlens or mask)")
        pad = shape.shard_len(a.world) - held
        if pad:
            tensors = [F.pad(t, (0, 0, 0, 0, 0, pad)) for t in tensors]
        return apply(a, *tensors).narrow(1, 0, held)

    def positions(self, n: int, cu_seqlens: Sequence[int] | None = None,
                  mask: masks.Mask | None = None) -> torch.Tensor:
        """The token positions (sorted, int64) this rank holds in a call on N = n tokens with
        these documents or this mask: the shards a call takes. The balanced layout deals by the
        call's relation (its documents, causal or not, its window), which only the attention
        knows: a model deals its inputs, labels and RoPE positions by this."""
        a = self.algo
        mask = mask if mask is not None else a.mask
        cu = layouts.as_cu(cu_seqlens)
        if mask is not None:
            n, cu = mask.n, layouts.call_cu(a.world, mask.n, mask.cu)
        if cu is not None:
            cu = layouts.normal_cu(a.layout, a.world, n, cu)
        relation = call_relation(a.layout, a.world, n, a.causal, cu, a.window, mask)
        return torch.tensor(rank_positions(a.layout, a.rank, a.world, n, relation),
                            dtype=torch.long)

    def expected_bytes(self, shape: AttnShape, cu_seqlens: Sequence[int] | None = None,
                       mask: masks.Mask | None = None) -> dict[str, int]:
        """The most bytes any rank sends per call on `shape` (with cu_seqlens or mask: that call's
        documents or mask), net of the transfers skipped under this attention's mask."""
        a = self.algo
        mask = mask if mask is not None else a.mask
        geometry = Geometry.of(shape, a.world, a.layout, a.causal, cu_seqlens, a.window, mask)
        per_rank = [type(a).bytes_of_rank(shape, a.world, a.options, r, geometry)
                    for r in range(a.world)]
        return {p: max(b[p] for b in per_rank) for p in ledger.PHASES}

    def __repr__(self) -> str:
        a = self.algo
        window = f", window={a.window}" if a.window is not None else ""
        seen = f"mask={a.mask.spec}" if a.mask is not None else f"causal={a.causal}{window}"
        return (f"Attention({self.name}, world={a.world}, layout={a.layout}, {seen}, "
                f"options={a.options.changed()})")
