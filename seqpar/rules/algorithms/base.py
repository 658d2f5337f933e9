"""What an algorithm *is*, apart from how it runs: its options, rank grid, rules and analytic bytes,
as class-level methods that need no process group and no torch. `seqpar.algorithms` subclasses each
`Rules` class with the forward and backward that run it; the planner reads the rules alone.

`Geometry` is what the queries of one call see, as the byte counts need it: the layout, the padded
length the algorithms run on and the relation or mask (`call_relation`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from seqpar.rules import blocks, layouts, masks
from seqpar.rules.grids import Grid
from seqpar.rules.options import Options
from seqpar.rules.relation import Relation
from seqpar.rules.shape import PHASES, AttnShape, check_shape


def call_relation(layout: str, world: int, n: int, causal: bool = True,
                  cu_seqlens: Sequence[int] | None = None, window: int | None = None,
                  mask: masks.Mask | None = None) -> Relation | masks.Mask:
    """What the queries of a call on N = n tokens see, as the algorithms run it: a classic relation
    (causal / full, documents, window; a mask of those kinds becomes its relation) or any other
    mask. Uneven shards (n not a multiple of the world) carry n as one document [0, n)."""
    if mask is not None:
        cu = layouts.call_cu(world, n, mask.cu)
        cu = None if cu is None else layouts.normal_cu(layout, world, n, cu)
        if mask.relation is not None:
            return Relation(mask.relation.causal, cu, mask.relation.window)
        return mask.with_cu(cu)
    cu = layouts.call_cu(world, n, layouts.as_cu(cu_seqlens) or None)
    if cu is not None:
        cu = layouts.normal_cu(layout, world, cu[-1], cu)
    return Relation(causal, cu, window)


def latent_message(shape: AttnShape, world: int, width: int, options: Options | None = None,
                   tokens_factor: int = 1) -> int:
    """Bytes of one rank's shard (tokens_factor shards) of MLA's latent, `width` values a token, in
    the input dtype, or with `options` in the gradient dtype (its gradient's message)."""
    elem = shape.elem_bytes if options is None else shape.grad_bytes(options)
    return shape.batch * shape.shard_len(world) * tokens_factor * width * elem


@dataclass(frozen=True)
class Geometry:
    """What the queries of a call see, as the analytic byte counts need it: the layout, the padded
    length the algorithms run on (s * P, s = ceil(N / P)) and the relation or mask."""

    layout: str
    seq_len: int
    relation: Relation | masks.Mask

    @classmethod
    def of(cls, shape: AttnShape, world: int, layout: str, causal: bool = True,
           cu_seqlens: Sequence[int] | None = None, window: int | None = None,
           mask: masks.Mask | None = None) -> Geometry:
        """The geometry of a call on `shape` (seq_len = N) as `Attention` builds it."""
        relation = call_relation(layout, world, shape.seq_len, causal, cu_seqlens, window, mask)
        return cls(layout, shape.shard_len(world) * world, relation)

    def need(self, world: int) -> tuple[tuple[bool, ...], ...]:
        """need[q_rank][k_rank] in the layout (`blocks.layout_need`)."""
        return blocks.layout_need(self.layout, world, self.seq_len, self.relation)

    def rank_pairs(self, world: int) -> list[int]:
        """Visible pairs of each rank's queries (the work of a ring-like algorithm's ranks)."""
        return blocks.rank_pairs(self.layout, world, self.seq_len, self.relation)


class Rules:
    """The class-level half of an algorithm (see the module docstring)."""

    name: ClassVar[str]
    summary: ClassVar[str]
    Options: ClassVar[type[Options]] = Options
    axes: ClassVar[tuple[str, ...]] = ()  # the mesh axes it communicates on besides "sp"
    # whether it can carry MLA's latent in place of K,V (mla_pass latent: `latent_bytes`)
    latent_pass: ClassVar[bool] = False

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
                      geometry: Geometry) -> dict[str, int]:
        """Bytes of `rank_bytes` that `rank` does not send under `geometry` because its schedule
        skips blocks no query ahead sees (option skip_transfers; none by default: collectives and
        all-to-alls send what they send)."""
        return dict.fromkeys(PHASES, 0)

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
                      geometry: Geometry | None = None) -> dict[str, int]:
        """Bytes `rank` sends per call; with the call's `geometry`, net of the skipped transfers
        (without it: the unskipped count, an upper bound when skip_transfers is on)."""
        opts = cls.parse(options)
        sent = cls.rank_bytes(shape, world, opts, rank)
        if geometry is None:
            return sent
        skipped = cls.skipped_bytes(shape, world, opts, rank, geometry)
        return {p: sent[p] - skipped[p] for p in sent}

    @classmethod
    def latent_bytes(cls, shape: AttnShape, world: int, options: Mapping[str, Any] | Options | None,
                     rank: int, width: int, geometry: Geometry | None = None) -> dict[str, int]:
        """Bytes `rank` sends per call with mla_pass latent: MLA's latent (`width` values a token:
        kv_lora_rank + qk_rope_dim) travels where K,V did; with `geometry`, net of the skipped
        transfers. Only where `latent_pass`."""
        raise NotImplementedError(f"{cls.name} does not carry the latent")

    @classmethod
    def skipped_of_rank(cls, shape: AttnShape, world: int,
                        options: Mapping[str, Any] | Options | None, rank: int,
                        geometry: Geometry) -> dict[str, int]:
        return cls.skipped_bytes(shape, world, cls.parse(options), rank, geometry)
