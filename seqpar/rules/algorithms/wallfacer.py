"""`wallfacer` (WallFacer, multi-ring with teams of C), its rules: the options, the rank grid
(collective-intra `(group, subring, team)`, p2p-intra `(group, team, subring)`) and every rank's bytes
(the team collectives, Alg. 2's placement, the sub-ring, the query-moving backward), net of what the
sub-ring's route skips."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from seqpar.errors import require
from seqpar.rules import blocks, groups, route
from seqpar.rules.algorithms.base import Geometry, Rules, latent_message
from seqpar.rules.algorithms.burst import (
    packed_size,
    query_block_bytes,
    query_ring_bytes,
    skipped_query_ring_bytes,
)
from seqpar.rules.algorithms.ring import skipped_ring_bytes
from seqpar.rules.grids import Grid
from seqpar.rules.groups import WallFacerGrid
from seqpar.rules.options import Options, divisors, is_int
from seqpar.rules.shape import AttnShape


@dataclass(frozen=True)
class WallFacerOptions(Options):
    team_size: int = 1                  # C: 1 <= C <= sqrt(P), C² divides P
    placement: str = "collective-intra"  # collective-intra | p2p-intra (WallFacer §4.4)

    def __post_init__(self) -> None:
        super().__post_init__()
        require(is_int(self.team_size) and self.team_size >= 1, "team_size", self.team_size,
                "must be a positive integer")
        require(self.placement in groups.WALLFACER_PLACEMENTS, "placement", self.placement,
                f"must be one of {', '.join(groups.WALLFACER_PLACEMENTS)}")

    def check(self, world: int) -> None:
        groups.check_wallfacer(world, self.team_size, self.placement)

    @classmethod
    def space(cls, world: int) -> list[Options]:
        """Every C with C² | P, both placements where they differ (C = 1 and C² = P have one
        team group or one-rank sub-rings: the two placements are the same ranks)."""
        out: list[Options] = []
        for c in divisors(world):
            if world % (c * c):
                continue
            both = 1 < c and c * c < world
            places = groups.WALLFACER_PLACEMENTS if both else (cls.placement,)
            out += [cls(team_size=c, placement=p) for p in places]
        return out


def grid_of(world: int, options: WallFacerOptions) -> WallFacerGrid:
    return WallFacerGrid(world, options.team_size, options.placement)


def wallfacer_grid(world: int, options: WallFacerOptions) -> Grid:
    """The rank grid: team group g, sub-ring position j, team member a (see the module docstring)."""
    c = options.team_size
    options.check(world)
    t = world // (c * c)
    if options.placement == "collective-intra":
        return Grid((("group", c), ("subring", t), ("team", c)))
    return Grid((("group", c), ("team", c), ("subring", t)))


class WallFacerRules(Rules):
    name = "wallfacer"
    summary = ("teams of C gather q,k,v; P/C² sub-ring steps of team K,V blocks; "
               "reduce-scatter-combine; backward moves the team's queries")
    Options = WallFacerOptions
    axes = ("team", "subring")

    @classmethod
    def grid(cls, world: int, options: Options, nodes: Sequence[int] | None = None) -> Grid:
        return wallfacer_grid(world, options)

    latent_pass = True

    @classmethod
    def rank_bytes(cls, shape: AttnShape, world: int, options: Options,
                   rank: int) -> dict[str, int]:
        """Bytes `rank` sends per call: Eq. 6 (collectives) and Eq. 7 (p2p), with GQA heads, lse,
        packing and gradients in the gradient dtype."""
        return _bytes(shape, world, options, rank, shape.kv_heads * shape.kv_unit(world),
                      shape.kv_heads * shape.kv_grad_unit(world, options))

    @classmethod
    def latent_bytes(cls, shape, world, options, rank, width, geometry=None):
        """With MLA's latent in place of K,V: gathered in the team, placed, around the sub-ring;
        its gradient placed home and reduce-scattered with dq (the query ring is unchanged)."""
        opts = cls.parse(options)
        one = latent_message(shape, world, width)
        sent = _bytes(shape, world, opts, rank, one, latent_message(shape, world, width, opts))
        if geometry is None:
            return sent
        skipped = _skipped(shape, world, opts, rank, geometry, one)
        return {p: sent[p] - skipped[p] for p in sent}

    @classmethod
    def skipped_bytes(cls, shape: AttnShape, world: int, options: Options, rank: int,
                      mask: Geometry) -> dict[str, int]:
        """The sub-ring's skipped messages (team collectives and the placement send all)."""
        return _skipped(shape, world, options, rank, mask,
                        shape.kv_heads * shape.kv_unit(world))

    @classmethod
    def expected_bytes(cls, shape: AttnShape, world: int, options: Options) -> dict[str, int]:
        """The most any rank sends (every rank that places its block elsewhere)."""
        per_rank = [cls.rank_bytes(shape, world, options, r) for r in range(world)]
        return {p: max(b[p] for b in per_rank) for p in ("forward", "backward")}


def _bytes(shape: AttnShape, world: int, options: Options, rank: int, kv: int,
           kv_grad: int) -> dict[str, int]:
    """`rank_bytes` with a shard's K,V (or MLA's latent) of `kv` bytes, its gradient `kv_grad`."""
    grid = grid_of(world, options)
    c, t = grid.team_size, grid.ring_size
    u, uv, h = shape.unit(world), shape.v_unit(world), shape.heads
    stats = shape.batch * shape.shard_len(world) * h * shape.acc_bytes  # a shard's lse or D
    block = c * kv                                                # a team's K,V
    mine = grid.init_send(rank) != rank
    q_block, dq_block = query_block_bytes(shape, world, tokens_factor=c, options=options)
    forward = ((c - 1) * (h * u + kv)                             # all-gather q, k, v
               + (block if mine else 0) + (t - 1) * block         # Alg. 2 placement, sub-ring
               + (c - 1) * (h * uv * shape.acc_bytes // shape.elem_bytes + stats))  # combine
    backward = ((c - 1) * packed_size([stats, stats, h * uv])      # all-gather D, lse, dO
                + query_ring_bytes(q_block, dq_block, t)
                + (c * kv_grad if mine else 0)                    # placed dK,dV home
                + (c - 1) * (h * shape.grad_unit(world, options) + kv_grad))  # reduce-scatter
    return {"forward": forward, "backward": backward}


def _skipped(shape: AttnShape, world: int, options: Options, rank: int, mask: Geometry,
             kv: int) -> dict[str, int]:
    grid = grid_of(world, options)
    c, t = grid.team_size, grid.ring_size
    if not options.skips(mask.relation) or t == 1:
        return {"forward": 0, "backward": 0}
    need_f, need_b = subring_needs(world, options, rank, mask)
    pos = grid.subring(rank).index(rank)
    fwd, bwd = route.plan(t, t, pos, need_f), route.plan(t, t, pos, need_b)
    q_block, dq_block = query_block_bytes(shape, world, tokens_factor=c, options=options)
    return {"forward": skipped_ring_bytes(c * kv, 0, fwd)["forward"],
            "backward": skipped_query_ring_bytes(q_block, dq_block, bwd)}


def subring_needs(world: int, options: WallFacerOptions, rank: int,
                  mask: Geometry) -> tuple[route.Need, route.Need]:
    """need[pos][src] on rank's sub-ring: forward, whether the team at pos sees the K,V block
    placed at src; backward (queries travel), whether the team of src sees the block held at pos."""
    grid = grid_of(world, options)
    teams = wallfacer_grid(world, options).groups("team")
    need = blocks.layout_need(mask.layout, world, mask.seq_len, mask.relation, teams)
    sub = grid.subring(rank)
    team = [grid.coords(x)[0] for x in sub]
    held = [grid.block_team(x) for x in sub]
    ring = range(len(sub))
    return (tuple(tuple(need[team[p]][held[j]] for j in ring) for p in ring),
            tuple(tuple(need[team[j]][held[p]] for j in ring) for p in ring))


def rank_bytes(shape: AttnShape, world: int, options, rank: int) -> dict[str, int]:
    """Module-level alias of WallFacer.rank_bytes (options: a mapping or WallFacerOptions)."""
    return WallFacerRules.bytes_of_rank(shape, world, options, rank)

