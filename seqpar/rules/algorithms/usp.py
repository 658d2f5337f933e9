"""`usp` (LoongTrain 2D-Attention), its rules: the options, the rank grid (head-first
`(outer, inner, hp)`, context-first `(hp, outer, inner)`), and the bytes of the all-to-alls and the
context ring (LoongTrain §4.5.3-4.5.4), net of what the context ring's route skips."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from seqpar.errors import require
from seqpar.rules import blocks, groups, route
from seqpar.rules.algorithms.base import Geometry, Rules, latent_message
from seqpar.rules.algorithms.ring import ring_bytes, skipped_ring_bytes
from seqpar.rules.algorithms.ulysses import (
    head_plan_bytes,
    kv_ranges,
    kv_replicas,
    seq_alltoall_bytes,
)
from seqpar.rules.grids import Grid
from seqpar.rules.options import Options, divisors, is_int
from seqpar.rules.shape import PHASES, AttnShape, divides


@dataclass(frozen=True)
class UspOptions(Options):
    dhp: int = 1                      # head-parallel degree (all-to-all group size)
    dcp: int | None = None            # context-parallel degree (ring size); default P / dhp
    placement: str = "head-first"     # head-first | context-first (LoongTrain §4.4)
    inner_ring: int | None = None     # inner ring size w (divides dcp); default dcp: one ring

    def __post_init__(self) -> None:
        super().__post_init__()
        require(is_int(self.dhp) and self.dhp >= 1, "dhp", self.dhp, "must be a positive integer")
        require(self.dcp is None or (is_int(self.dcp) and self.dcp >= 1), "dcp", self.dcp,
                "must be a positive integer")
        require(self.placement in groups.PLACEMENTS, "placement", self.placement,
                f"must be one of {', '.join(groups.PLACEMENTS)}")
        require(self.inner_ring is None or (is_int(self.inner_ring) and self.inner_ring >= 1),
                "inner_ring", self.inner_ring, "must be a positive integer")

    def resolved(self, world: int) -> tuple[int, int, str, int]:
        """(dhp, dcp, placement, inner ring w) at this world size, after its rules."""
        require(world % self.dhp == 0, "dhp", self.dhp,
                f"must be a positive divisor of the world size ({world})")
        dcp = world // self.dhp if self.dcp is None else self.dcp
        require(self.dhp * dcp == world, "dcp", dcp,
                f"dhp * dcp must equal the world size ({world}) with dhp={self.dhp}")
        inner = dcp if self.inner_ring is None else self.inner_ring
        require(dcp % inner == 0, "inner_ring", inner, f"must be a positive divisor of dcp ({dcp})")
        return self.dhp, dcp, self.placement, inner

    def check(self, world: int) -> None:
        self.resolved(world)

    @classmethod
    def space(cls, world: int) -> list[Options]:
        out: list[Options] = []
        for dhp in divisors(world):
            dcp = world // dhp
            for placement in groups.PLACEMENTS if 1 < dhp < world else groups.PLACEMENTS[:1]:
                out += [cls(dhp=dhp, dcp=dcp, placement=placement, inner_ring=w)
                        for w in divisors(dcp)]
        return out


def grid_of(world: int, options: Mapping[str, Any] | UspOptions) -> tuple[int, int, str, int]:
    """(dhp, dcp, placement, inner ring w) after the world-level rules."""
    return UspOptions.parse(options, "usp").resolved(world)


def usp_grid(world: int, options: UspOptions) -> Grid:
    """The rank grid of a usp configuration (see the module docstring)."""
    dhp, dcp, placement, inner = options.resolved(world)
    cp = (("outer", dcp // inner), ("inner", inner))
    dims = (*cp, ("hp", dhp)) if placement == "head-first" else (("hp", dhp), *cp)
    return Grid(dims, (("cp", ("outer", "inner")),))


class UspRules(Rules):
    name = "usp"
    summary = "LoongTrain 2D: all-to-all in head-parallel groups, (double) ring in context groups"
    Options = UspOptions
    axes = ("hp", "cp", "inner", "outer")
    latent_pass = True

    @classmethod
    def latent_bytes(cls, shape, world, options, rank, width, geometry=None):
        """With MLA's latent: q and out (dout and dq) by all-to-all over HP; the latent all-gathered
        over HP (every member rebuilds its own heads from every token's latent), the HP group's
        latents around the context ring, their gradient reduce-scattered over HP."""
        opts = cls.parse(options)
        dhp, dcp, _, inner = opts.resolved(world)
        one, grad = latent_message(shape, world, width), latent_message(shape, world, width, opts)
        a2a = (dhp - 1) * (shape.heads // dhp) * shape.kv_unit(world)
        ring = ring_bytes(dhp * one, dcp, dhp * grad)
        sent = {"forward": a2a + (dhp - 1) * one + ring["forward"],
                "backward": a2a + ring["backward"] + (dhp - 1) * grad}
        if geometry is None or dcp == 1 or not opts.skips(geometry.relation):
            return sent
        grid = usp_grid(world, opts)
        need = blocks.layout_need(geometry.layout, world, geometry.seq_len, geometry.relation,
                                  grid.groups("hp"))
        plan = route.plan(dcp, inner, grid.coord("cp", rank), need)
        skipped = skipped_ring_bytes(dhp * one, dhp * grad, plan)
        return {p: sent[p] - skipped[p] for p in sent}

    @classmethod
    def grid(cls, world: int, options: Options, nodes: Sequence[int] | None = None) -> Grid:
        return usp_grid(world, options)

    @classmethod
    def rules(cls, shape: AttnShape, world: int, options: Options) -> None:
        dhp = options.resolved(world)[0]
        divides("heads", shape.heads, dhp, "dhp")

    @classmethod
    def rank_bytes(cls, shape: AttnShape, world: int, options: Options,
                   rank: int) -> dict[str, int]:
        by_op = bytes_by_op(shape, world, options, rank)
        return {phase: sum(ops.values()) for phase, ops in by_op.items()}

    @classmethod
    def expected_bytes(cls, shape: AttnShape, world: int, options: Options) -> dict[str, int]:
        by_op = bytes_by_op(shape, world, options)
        return {phase: sum(ops.values()) for phase, ops in by_op.items()}

    @classmethod
    def skipped_bytes(cls, shape: AttnShape, world: int, options: Options, rank: int,
                      mask: Geometry) -> dict[str, int]:
        """The context ring's skipped messages (the all-to-alls send what they send)."""
        dhp, dcp, _, inner = options.resolved(world)
        if not options.skips(mask.relation) or dcp == 1:
            return super().skipped_bytes(shape, world, options, rank, mask)
        grid = usp_grid(world, options)
        need = blocks.layout_need(mask.layout, world, mask.seq_len, mask.relation,
                                   grid.groups("hp"))
        pos = grid.coord("cp", rank)  # which HP group's tokens rank holds: its ring position
        kv_heads = ring_kv_heads(shape, dhp, grid.coord("hp", rank))
        return skipped_ring_bytes(kv_heads * shape.kv_unit(world),
                                  kv_heads * shape.kv_grad_unit(world, options),
                                  route.plan(dcp, inner, pos, need))


def ring_kv_heads(shape: AttnShape, dhp: int, member: int) -> int:
    """K,V heads of the context ring's message, counted in shards of N/P tokens: max(Hkv, dhp)
    (split or replicated evenly), or with per-member ranges (`ulysses.kv_ranges`) member's range
    width over the dhp shards of its HP group."""
    ranges = kv_ranges(shape.heads, shape.kv_heads, dhp)
    if ranges is None:
        return shape.kv_heads * kv_replicas(shape.kv_heads, dhp)
    lo, hi = ranges[member]
    return (hi - lo) * dhp


def bytes_by_op(shape: AttnShape, world: int, options: Mapping[str, Any] | Options,
                rank: int | None = None) -> dict[str, dict[str, int]]:
    """Analytic bytes a rank sends per phase and op (LoongTrain §4.5.3-4.5.4): `rank`'s, or
    (None) the busiest rank's in each phase.

    all_to_all: AlltoAll_Volume = (dhp-1)/dhp x (Size(q) + Size(k) + Size(v) + Size(out)), with
    K,V replicated to max(Hkv, dhp) heads, in each phase. p2p: Size(kv) = max(Hkv, dhp)·(u + u_v) per
    message (H/dhp heads of N/dcp tokens); dcp-1 messages forward (inner and outer rings together),
    and backward dcp-1 for K,V plus dcp for dK,dV (in the gradient dtype), as in a plain ring.
    With K,V head ranges (kv_heads neither a multiple nor a divisor of dhp) the members differ:
    q and out (dout and dq) by all-to-all, K,V heads by `ulysses.head_plan_bytes`, and the ring
    carries the member's range (`ring_kv_heads`).
    """
    opts = options if isinstance(options, UspOptions) else UspOptions.parse(
        options.as_dict() if isinstance(options, Options) else options, "usp")
    dhp, dcp, _, _ = opts.resolved(world)
    ranges = kv_ranges(shape.heads, shape.kv_heads, dhp)
    if ranges is not None and rank is None:
        per_rank = [bytes_by_op(shape, world, opts, r) for r in range(world)]
        return {phase: max((b[phase] for b in per_rank), key=lambda ops: sum(ops.values()))
                for phase in PHASES}
    member = 0 if ranges is None else usp_grid(world, opts).coord("hp", rank)
    kv_heads = ring_kv_heads(shape, dhp, member)
    if ranges is None:
        a2a = dict.fromkeys(PHASES, seq_alltoall_bytes(shape, dhp, world, kv_heads))
    else:
        a2a = head_plan_bytes(shape, dhp, world, member)
    p2p = ring_bytes(kv_heads * shape.kv_unit(world), dcp,
                     kv_heads * shape.kv_grad_unit(world, opts))
    return {phase: {"all_to_all": a2a[phase], "p2p": p2p[phase]} for phase in PHASES}

