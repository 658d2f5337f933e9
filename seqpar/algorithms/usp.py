"""`usp` (LoongTrain 2D-Attention): P = dhp x dcp ranks, all-to-all inside each head-parallel (HP)
group, (double) ring attention inside each context-parallel (CP) group (LoongTrain §4.1, Alg. 1).

The rank grid (mesh.py): head-first `(outer, inner, hp)`, context-first `(hp, outer, inner)`, with
cp = outer x inner (§4.4, Fig. 11: nodes are blocks of consecutive ranks, so head-first keeps an HP
group on a node and context-first a CP group). Each axis is a process group of its own.

Forward: K,V heads replicated to dhp when kv_heads < dhp (§4.2); one all-to-all in the HP group turns
q, k, v from sequence shards into H/dhp-head shards of the HP group's tokens; the CP group runs
`ring.ring_forward` on them with inner rings of `inner_ring` = w (w < dcp: Double-Ring-Attention,
Alg. 2, the outer ring's prefetch on its own communicator overlapping the inner ring); one
all-to-all brings out back. Backward, in one fixed order on every rank: all-to-all of dout,
`ring.ring_backward` (K,V and their dK,dV travel), one all-to-all of dq, dk, dv; replicas' dK,dV
summed.

Token order (LoongTrain's data-loader post-processing, §4.4): after the all-to-all a rank holds its HP
group's shards in member order. `tokens.gather_plan` over the HP groups decides whether they are
permuted into token order (contiguous, zigzag) or kept in member order (stripe), and plans every
inner-ring block from it, so every layout and placement is exact without re-dealing the input.

K,V heads that neither split nor replicate over dhp (kv_heads neither a multiple nor a divisor of
dhp: H=6, Hkv=3, dhp=2) go as ulysses sends them: each HP member receives exactly the K,V heads its
query heads read (`ulysses.kv_ranges`, point-to-point), the context ring carries that range, and each
rank expands it to one K,V head per query head only for its kernel calls; backward sums the expanded
heads' gradients back into the range before they travel, and sends each member's share home.

`double_ring` is the dhp = 1 case. dhp = 1 is exactly `ring`, dcp = 1 exactly `ulysses`: the same
bytes.

With skip_transfers the context ring (inner rings, outer prefetch and the gradients) skips the blocks
no query of an HP group's holding sees (`route`, need over the holdings); the all-to-alls move every
head of every token and skip nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from seqpar.algorithms import blocks, groups, layouts, ledger, tokens
from seqpar.algorithms.base import Algorithm, AttnShape, Geometry, divides
from seqpar.algorithms.mesh import Grid
from seqpar.algorithms.options import Options, divisors, is_int
from seqpar.algorithms.ring import (
    RingComms,
    plan_of,
    ring_backward,
    ring_bytes,
    ring_forward,
    skipped_ring_bytes,
)
from seqpar.algorithms.ulysses import (
    head_plan_bytes,
    heads_to_seq,
    kv_grads_to_seq,
    kv_ranges,
    kv_replicas,
    kv_to_heads,
    local_kv_index,
    replicate_kv,
    seq_alltoall_bytes,
    seq_to_heads,
    sum_replicas,
)
from seqpar.errors import require
from seqpar.rules import route


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


class Usp(Algorithm):
    name = "usp"
    summary = "LoongTrain 2D: all-to-all in head-parallel groups, (double) ring in context groups"
    Options = UspOptions
    axes = ("hp", "cp", "inner", "outer")

    @classmethod
    def grid(cls, world: int, options: Options, nodes: Sequence[int] | None = None) -> Grid:
        return usp_grid(world, options)

    def plan(self, seq_len: int) -> tokens.GatherPlan:
        holders = usp_grid(self.world, self.options).groups("hp")  # by CP position
        return tokens.gather_plan(self.layout, self.world, seq_len, holders, self.relation)

    def need(self, seq_len: int) -> route.Need | None:
        """need[pos][src] of the context ring (None: skip_transfers off)."""
        if not self.options.skips(self.relation):
            return None
        holders = usp_grid(self.world, self.options).groups("hp")
        return layouts.layout_need(self.layout, self.world, seq_len, self.relation, holders)

    def forward(self, q, k, v):
        hp, comms = self.mesh.comm("hp"), RingComms.of(self.mesh, "cp")
        me = comms.ring.rank  # CP position: which HP group's tokens this rank holds
        plan = self.plan(q.shape[1] * self.world)
        path = plan_of(comms, self.need(q.shape[1] * self.world))
        order = plan.order(me, q.device)
        ranges = kv_ranges(q.shape[2], k.shape[2], hp.size)
        if ranges is None:  # K,V heads split (or are replicated up to dhp) evenly
            kv_index, undo = None, kv_replicas(k.shape[2], hp.size)
            k, v = replicate_kv(k, v, undo)
            qh, kh, vh = seq_to_heads([q, k, v], hp, order)
        else:  # each member receives exactly the K,V heads its query heads read (ulysses)
            kv_index = local_kv_index(q.shape[2], k.shape[2], hp.size, hp.rank).to(q.device)
            undo = (ranges, k.shape[2])
            (qh,) = seq_to_heads([q], hp, order)
            kh, vh = kv_to_heads(k, v, hp, ranges, order)
        kv = blocks.pack_kv(kh, vh)

        def tasks_for(src: int):
            return plan.tasks(me, src)

        acc_out, acc_lse = blocks.new_partial(qh)
        ring_forward(qh, kv, comms, tasks_for, acc_out, acc_lse, self.backend, self.scale, path,
                     kv_index)
        out_h = acc_out.to(q.dtype)
        (out,) = heads_to_seq([out_h], hp, plan.inverse(me, q.device))
        return out, (qh, kv, out_h, acc_lse), (plan, me, undo, tasks_for, path, kv_index)

    def backward(self, dout, saved, state):
        qh, kv, out_h, lse = saved
        plan, me, undo, tasks_for, path, kv_index = state
        hp, comms = self.mesh.comm("hp"), RingComms.of(self.mesh, "cp")
        dq = blocks.zeros_acc(qh)
        # one fixed order on every rank: a2a, ring (K,V then dK,dV), a2a
        (doh,) = seq_to_heads([dout], hp, plan.order(me, dout.device))
        dkv = ring_backward(doh, qh, kv, out_h, lse, comms, tasks_for, dq, self.backend,
                            self.scale, self.grad_dtype(qh), path, kv_index)
        dkh, dvh = blocks.unpack_kv(dkv.to(qh.dtype))
        inverse = plan.inverse(me, dout.device)
        if kv_index is None:
            dq, dk, dv = heads_to_seq([dq.to(qh.dtype), dkh, dvh], hp, inverse)
            dk, dv = sum_replicas(dk, dv, undo)
        else:
            ranges, kv_heads = undo
            (dq,) = heads_to_seq([dq.to(qh.dtype)], hp, inverse)
            dk, dv = kv_grads_to_seq(dkh, dvh, hp, ranges, inverse, kv_heads)
        return dq, dk, dv

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
        need = layouts.layout_need(mask.layout, world, mask.seq_len, mask.relation,
                                   grid.groups("hp"))
        pos = grid.coord("cp", rank)  # which HP group's tokens rank holds: its ring position
        kv_heads = ring_kv_heads(shape, dhp, grid.coord("hp", rank))
        return skipped_ring_bytes(2 * kv_heads * shape.unit(world),
                                  2 * kv_heads * shape.grad_unit(world, options),
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
    K,V replicated to max(Hkv, dhp) heads, in each phase. p2p: Size(kv) = 2·max(Hkv, dhp)·u per
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
                for phase in ledger.PHASES}
    member = 0 if ranges is None else usp_grid(world, opts).coord("hp", rank)
    kv_heads = ring_kv_heads(shape, dhp, member)
    if ranges is None:
        a2a = dict.fromkeys(ledger.PHASES, seq_alltoall_bytes(shape, dhp, world, kv_heads))
    else:
        a2a = head_plan_bytes(shape, dhp, world, member)
    p2p = ring_bytes(2 * kv_heads * shape.unit(world), dcp,
                     2 * kv_heads * shape.grad_unit(world, opts))
    return {phase: {"all_to_all": a2a[phase], "p2p": p2p[phase]} for phase in ledger.PHASES}
