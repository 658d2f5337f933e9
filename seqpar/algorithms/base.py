"""What every distributed attention shares: its shape, its rules, its mesh and one autograd shell.

An algorithm is a subclass of `Algorithm` with a typed `Options` class, a `grid` (its rank grid, see
mesh.py), its rules and analytic bytes (class methods: no process group needed), and a `forward` /
`backward` pair that reads like its paper's algorithm box:

    forward(q, k, v)            -> (out, tensors to save for backward, other state)
    backward(dout, saved, state) -> (dq, dk, dv)

`_Shell`, the one `torch.autograd.Function`, does the rest for every algorithm: it saves tensors
through `save_for_backward` (so saved-tensor hooks and activation meters see them), books backward
communication into the ledgers that were active in forward, and casts gradients to the inputs' dtypes.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from seqpar.algorithms import kernels, layouts, ledger
from seqpar.algorithms.mesh import Grid, Mesh
from seqpar.algorithms.options import Options
from seqpar.errors import require
from seqpar.rules import masks
from seqpar.rules.blocks import rank_positions

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16,
          "float16": torch.float16}


@dataclass(frozen=True)
class AttnShape:
    """The global shape of one attention call: N = seq_len tokens over the whole group."""

    batch: int
    seq_len: int
    heads: int
    kv_heads: int
    head_dim: int
    elem_bytes: int = 4

    def shard_len(self, world: int) -> int:
        """s: rows of every rank's shard as it travels, ceil(N / P) (uneven shards are padded)."""
        return layouts.shard_len(self.seq_len, world)

    def unit(self, world: int) -> int:
        """u = B * s * D * e: bytes of one head of one rank's shard."""
        return self.batch * self.shard_len(world) * self.head_dim * self.elem_bytes

    @property
    def acc_bytes(self) -> int:
        """Bytes of one element in the accumulation dtype (float64 for float64, else float32)."""
        return 8 if self.elem_bytes == 8 else 4

    def grad_bytes(self, options: Options) -> int:
        """Bytes of one element of a gradient message that is summed where it arrives."""
        return self.acc_bytes if options.grad_dtype == "accumulate" else self.elem_bytes

    def grad_unit(self, world: int, options: Options) -> int:
        """u for gradient messages: B * s * D * (bytes of the gradient dtype)."""
        return self.unit(world) // self.elem_bytes * self.grad_bytes(options)


def call_relation(layout: str, world: int, n: int, causal: bool = True,
                  cu_seqlens: Sequence[int] | None = None, window: int | None = None,
                  mask: masks.Mask | None = None) -> layouts.Relation | masks.Mask:
    """What the queries of a call on N = n tokens see, as the algorithms run it: a classic relation
    (causal / full, documents, window; a mask of those kinds becomes its relation) or any other
    mask. Uneven shards (n not a multiple of the world) carry n as one document [0, n)."""
    if mask is not None:
        cu = layouts.call_cu(world, n, mask.cu)
        cu = None if cu is None else layouts.normal_cu(layout, world, n, cu)
        if mask.relation is not None:
            return layouts.Relation(mask.relation.causal, cu, mask.relation.window)
        return mask.with_cu(cu)
    cu = layouts.call_cu(world, n, layouts.as_cu(cu_seqlens) or None)
    if cu is not None:
        cu = layouts.normal_cu(layout, world, cu[-1], cu)
    return layouts.Relation(causal, cu, window)


@dataclass(frozen=True)
class Geometry:
    """What the queries of a call see, as the analytic byte counts need it: the layout, the padded
    length the algorithms run on (s * P, s = ceil(N / P)) and the relation or mask."""

    layout: str
    seq_len: int
    relation: layouts.Relation | masks.Mask

    @classmethod
    def of(cls, shape: AttnShape, world: int, layout: str, causal: bool = True,
           cu_seqlens: Sequence[int] | None = None, window: int | None = None,
           mask: masks.Mask | None = None) -> Geometry:
        """The geometry of a call on `shape` (seq_len = N) as `Attention` builds it."""
        relation = call_relation(layout, world, shape.seq_len, causal, cu_seqlens, window, mask)
        return cls(layout, shape.shard_len(world) * world, relation)

    def need(self, world: int) -> tuple[tuple[bool, ...], ...]:
        """need[q_rank][k_rank] in the layout (`layouts.layout_need`)."""
        return layouts.layout_need(self.layout, world, self.seq_len, self.relation)

    def rank_pairs(self, world: int) -> list[int]:
        """Visible pairs of each rank's queries (the work of a ring-like algorithm's ranks)."""
        return layouts.rank_pairs(self.layout, world, self.seq_len, self.relation)


Mask = Geometry  # the name the callers outside algorithms used before masks.Mask existed


class Algorithm:
    """A distributed attention (see the module docstring). Built by `build_attention`."""

    name: ClassVar[str]
    summary: ClassVar[str]
    Options: ClassVar[type[Options]] = Options
    axes: ClassVar[tuple[str, ...]] = ()  # the mesh axes it communicates on besides "sp"

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

    def for_call(self, relation: layouts.Relation) -> Algorithm:
        """This algorithm for one call whose queries see keys by `relation` (a shallow copy: the
        mesh, options and caches are shared; the relation is the call's own)."""
        call = copy.copy(self)
        call.relation = relation
        return call

    # -- class level: no process group needed ----------------------------------------------------
    @classmethod
    def parse(cls, options: Mapping[str, Any] | Options | None) -> Options:
        return cls.Options.parse(options, cls.name)

    @classmethod
    def grid(cls, world: int, options: Options, nodes: Sequence[int] | None = None) -> Grid:
        """The rank grid this algorithm lays on a group of `world` ranks (nodes: each rank's)."""
        return Grid.line(world)

    @classmethod
    def rules(cls, shape: AttnShape, world: int, options: Options) -> None:
        """Rules beyond the options' own and the layout's (none by default)."""

    @classmethod
    def expected_bytes(cls, shape: AttnShape, world: int, options: Options) -> dict[str, int]:
        """The most bytes any rank sends per call, by phase."""
        raise NotImplementedError

    @classmethod
    def rank_bytes(cls, shape: AttnShape, world: int, options: Options,
                   rank: int) -> dict[str, int]:
        """Bytes `rank` sends per call (by default every rank sends the same)."""
        return cls.expected_bytes(shape, world, options)

    @classmethod
    def skipped_bytes(cls, shape: AttnShape, world: int, options: Options, rank: int,
                      mask: Geometry) -> dict[str, int]:
        """Bytes of `rank_bytes` that `rank` does not send under `mask` because its schedule skips
        blocks no query ahead sees (option skip_transfers; none by default: collectives and
        all-to-alls send what they send)."""
        return dict.fromkeys(ledger.PHASES, 0)

    @classmethod
    def check(cls, shape: AttnShape, world: int, layout: str, causal: bool,
              options: Mapping[str, Any] | Options | None,
              cu_seqlens: tuple[int, ...] | None = None) -> Options:
        """Every rule for this configuration; raises ConfigError naming field, value and rule."""
        opts = cls.parse(options)
        check_shape(shape)
        layouts.check_seq_len(layout, world, shape.seq_len, cu_seqlens)
        layouts.check_documents(layout, world, shape.seq_len, cu_seqlens)
        opts.check(world)
        cls.rules(shape, world, opts)
        return opts

    @classmethod
    def bytes_of_rank(cls, shape: AttnShape, world: int,
                      options: Mapping[str, Any] | Options | None, rank: int,
                      mask: Geometry | None = None) -> dict[str, int]:
        """Bytes `rank` sends per call; with the call's `mask`, net of the skipped transfers
        (without it: the unskipped count, an upper bound when skip_transfers is on)."""
        opts = cls.parse(options)
        sent = cls.rank_bytes(shape, world, opts, rank)
        if mask is None:
            return sent
        skipped = cls.skipped_bytes(shape, world, opts, rank, mask)
        return {p: sent[p] - skipped[p] for p in sent}

    @classmethod
    def skipped_of_rank(cls, shape: AttnShape, world: int,
                        options: Mapping[str, Any] | Options | None, rank: int,
                        mask: Geometry) -> dict[str, int]:
        return cls.skipped_bytes(shape, world, cls.parse(options), rank, mask)

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

    def backward(self, dout: torch.Tensor, saved: tuple[torch.Tensor, ...],
                 state: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        raise NotImplementedError


class _Shell(torch.autograd.Function):
    """The one autograd Function: every algorithm's forward and backward run inside it."""

    @staticmethod
    def forward(ctx, algo: Algorithm, q, k, v):
        out, saved, state = algo.forward(q, k, v)
        ctx.algo, ctx.state, ctx.ledgers = algo, state, ledger.active()
        ctx.dtypes = (q.dtype, k.dtype, v.dtype)
        ctx.save_for_backward(*saved)
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, dout):
        saved, state = ctx.saved_tensors, ctx.state
        ctx.state = None
        # autograd may run backward on another thread (CUDA), where forward's context is not set
        with ledger.backward_of(ctx.ledgers):
            grads = ctx.algo.backward(dout.contiguous(), saved, state)
        return (None, *(g.to(dt) for g, dt in zip(grads, ctx.dtypes, strict=True)))


def check_shape(shape: AttnShape) -> None:
    for name in ("batch", "seq_len", "heads", "kv_heads", "head_dim"):
        value = getattr(shape, name)
        require(isinstance(value, int) and value > 0, name, value, "must be a positive integer")
    require(shape.heads % shape.kv_heads == 0, "kv_heads", shape.kv_heads,
            f"must divide heads={shape.heads}")


def divides(field_name: str, value: int, world: int, what: str = "the world size") -> None:
    require(value % world == 0, field_name, value, f"must be divisible by {what} ({world})")


def shape_of(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, world: int) -> AttnShape:
    """Validate local shards (batch, seq, heads, head_dim) and return the global shape."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        require(t.dim() == 4, f"{name}.shape", tuple(t.shape),
                "must be (batch, seq, heads, head_dim)")
    require(k.shape == v.shape, "v.shape", tuple(v.shape), f"must equal k.shape {tuple(k.shape)}")
    require(q.shape[0] == k.shape[0] and q.shape[1] == k.shape[1] and q.shape[3] == k.shape[3],
            "k.shape", tuple(k.shape),
            f"must match q.shape {tuple(q.shape)} in batch, seq and head_dim")
    require(q.dtype == k.dtype == v.dtype, "k.dtype", str(k.dtype),
            f"q, k and v must share one dtype (q is {q.dtype})")
    require(q.dtype in DTYPES.values(), "q.dtype", str(q.dtype),
            f"must be one of {', '.join(DTYPES)}")
    return AttnShape(q.shape[0], q.shape[1] * world, q.shape[2], k.shape[2], q.shape[3],
                     q.element_size())


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
                 mask: masks.Mask | None = None) -> torch.Tensor:
        """out for this rank's shards. cu_seqlens: the global document boundaries [0, ..., N]
        (int64, the same on every rank; shards dealt by `layouts.shard(..., cu_seqlens=)`). mask:
        what every query sees (a `masks.Mask` of N tokens, the same on every rank; it takes the
        place of causal, window and cu_seqlens, and of the mask the attention was built with;
        shards dealt by `layouts.shard(..., mask=)`)."""
        a = self.algo
        shape = shape_of(q, k, v, a.world)
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
        kernels.resolve_backend(a.backend, q.device, q.dtype, head_dim=q.shape[-1])
        relation = call_relation(a.layout, a.world, shape.seq_len, a.causal, cu, a.window, mask)
        a = a.for_call(relation)
        held = len(rank_positions(a.layout, a.rank, a.world, shape.seq_len, relation))
        if cu is None and held == q.shape[1]:
            return _Shell.apply(a, q, k, v)
        require(q.shape[1] == held, "q.shape", tuple(q.shape),
                f"rank {a.rank} holds {held} of the N={shape.seq_len} tokens in the {a.layout} "
                f"layout (layouts.shard with cu_seqlens or mask)")
        pad = shape.shard_len(a.world) - held
        if pad:
            q, k, v = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (q, k, v))
        return _Shell.apply(a, q, k, v).narrow(1, 0, held)

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
