"""`wallfacer` (WallFacer multi-ring attention, §4.2-4.5): teams of C ranks, sub-rings of P/C² teams.

Forward (Alg. 1): all-gather q, k, v inside the team (every member then
holds the team's C shards, in token order or member order as `tokens.gather_plan` decides over the
teams, which plans every team-to-team block); send the team's K,V to the Alg. 2 target
(`get_init_send`), so the team's members hold different K,V blocks; P/C² steps of
`ring.ring_forward` on the Alg. 3 sub-ring (`get_P2P_config`), each member attending the team's
queries to 1/C of the keys; then an all-to-all of the partial (out, lse) inside the team and the
online-softmax merge of the C partials of one's own shard ("reduce-scatter-combine": the bytes of a
reduce-scatter, exact because it is the merge, not a sum). The partials travel in the accumulation
dtype, so lse keeps its precision.

Backward (§4.2.1), one fixed order on every rank: each member computes
D = rowsum(dO * O) for its own shard and the team all-gathers (dO, D, lse); K,V stay where the
initial placement put them (with their dK,dV accumulators) while the team's queries, with dO, D, lse,
travel the sub-ring and their dq follows one step behind and arrives home (BurstAttention's query ring,
`burst.query_ring_backward`); the dK,dV of each placed block go back to the rank that placed it (the
inverse of Alg. 2), and one reduce-scatter inside the team sums and scatters dq, dk, dv.

C = 1 is ring in outputs and forward bytes (no team, every placement is to oneself); its backward
moves queries, so it is burst's backward. C = sqrt(P) has one team group per sub-ring of one rank:
no ring steps, only the collectives and the initial placement. Ranks whose Alg. 2 target is
themselves send nothing, so bytes differ by rank: `rank_bytes` gives each rank's.

Memory: every member keeps the team's q and its placed K,V block for backward, 3C activations
instead of ring's 3 (Eq. 9-10).

The rank grid (mesh.py): collective-intra `(group, subring, team)` puts a team on consecutive ranks,
p2p-intra `(group, team, subring)` a sub-ring; the team and the sub-ring are process groups of their
own, and Alg. 2's placement exchange runs on the whole group. `groups.WallFacerGrid` holds Alg. 2
and 3 (`get_init_send`, `get_p2p_config`); a test holds its teams and sub-rings against the grid's.

With skip_transfers the sub-rings skip (`route`, `subring_needs`): forward a team K,V block travels
only as far as the last team that sees it, backward a team's queries only as far as the last K,V
block they see. The team collectives and the placement send what they send.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from seqpar.algorithms import blocks, groups, layouts, route, tokens
from seqpar.algorithms.base import Algorithm, AttnShape, Mask
from seqpar.algorithms.burst import (
    pack_bytes,
    packed_size,
    query_backward,
    query_block_bytes,
    query_parts,
    query_ring_backward,
    query_ring_bytes,
    rowsum_delta,
    skipped_query_ring_bytes,
    unpack_bytes,
)
from seqpar.algorithms.comm import Comm
from seqpar.algorithms.groups import WallFacerGrid
from seqpar.algorithms.mesh import Grid
from seqpar.algorithms.options import Options, divisors, is_int
from seqpar.algorithms.ring import RingComms, plan_of, ring_forward, skipped_ring_bytes
from seqpar.algorithms.softmax_merge import merge_into
from seqpar.errors import require

PLACE_TAG = 31


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


def _place(comm: Comm, t: torch.Tensor, to: int, frm: int) -> torch.Tensor:
    """Send t to `to` and receive its like from `frm`; nothing moves when both are this rank."""
    if to == comm.rank:
        return t
    (got,) = comm.exchange([(t, to)], [(torch.empty_like(t), frm)], tag=PLACE_TAG).wait()
    return got


def combine(team: Comm, acc_out: torch.Tensor, acc_lse: torch.Tensor,
            inverse: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Reduce-scatter-combine: each member gets the C partials of its own shard and merges them."""
    b, _, h, d = acc_out.shape
    out_m = blocks.permute(acc_out, inverse)
    lse_m = blocks.permute(acc_lse.transpose(1, 2), inverse)  # (B, C*s, H): scatter along tokens
    outs, lses = team.all_to_all([out_m, lse_m], scatter_dim=1, gather_dim=0)
    g = team.size
    outs, lses = outs.view(g, b, -1, h, d), lses.view(g, b, -1, h)
    out, lse = outs[0], lses[0].transpose(1, 2)
    for i in range(1, g):  # in place, into member 0's partial: no new out per member
        merge_into(out, lse, outs[i], lses[i].transpose(1, 2))
    # its own storage, so the C-times buffer of the all-to-all is not kept alive with it
    return (out.clone() if g > 1 else out), lse.contiguous()


class WallFacer(Algorithm):
    name = "wallfacer"
    summary = ("teams of C gather q,k,v; P/C² sub-ring steps of team K,V blocks; "
               "reduce-scatter-combine; backward moves the team's queries")
    Options = WallFacerOptions
    axes = ("team", "subring")

    @classmethod
    def grid(cls, world: int, options: Options, nodes: Sequence[int] | None = None) -> Grid:
        return wallfacer_grid(world, options)

    def plan(self, seq_len: int) -> tokens.GatherPlan:
        teams = wallfacer_grid(self.world, self.options).groups("team")  # by team index
        return tokens.gather_plan(self.layout, self.world, seq_len, teams, self.relation)

    def needs(self, seq_len: int) -> tuple[route.Need | None, route.Need | None]:
        """need[pos][src] of this rank's sub-ring, forward and backward (None: skip off)."""
        if not self.options.skips(self.relation):
            return None, None
        mask = Mask(self.layout, seq_len, self.relation)
        return subring_needs(self.world, self.options, self.rank, mask)

    def forward(self, q, k, v):
        grid = grid_of(self.world, self.options)
        team, ring = self.mesh.comm("team"), RingComms.of(self.mesh, "subring")
        plan = self.plan(q.shape[1] * self.world)
        need_f, need_b = self.needs(q.shape[1] * self.world)
        mine = grid.coords(self.rank)[0]
        heads = (q.shape[2], k.shape[2], v.shape[2])
        # Alg. 1 line 1: the team's q, k, v in one all-gather, then in the plan's order
        qkv = blocks.permute(team.all_gather(torch.cat([q, k, v], dim=2), dim=1),
                             plan.order(mine, q.device))
        q_t, k_t, v_t = (t.contiguous() for t in qkv.split(heads, dim=2))
        # Alg. 2: the team's K,V block to its initial place in the sub-rings
        kv0 = _place(self.comm, blocks.pack_kv(k_t, v_t), grid.init_send(self.rank),
                     grid.init_recv(self.rank))
        sub = grid.subring(self.rank)

        def tasks_for(j: int):  # the team's queries against the block sub-ring member j placed
            return plan.tasks(mine, grid.block_team(sub[j]))

        acc_out, acc_lse = blocks.new_partial(q_t)
        ring_forward(q_t, kv0, ring, tasks_for, acc_out, acc_lse, self.backend, self.scale,
                     plan_of(ring, need_f))
        out, lse = combine(team, acc_out, acc_lse, plan.inverse(mine, q.device))
        out = out.to(q.dtype)
        return out, (q_t, kv0, out, lse), (plan, heads, need_b)

    def backward(self, dout, saved, state):
        q_t, kv0, out, lse = saved
        plan, heads, need_b = state
        grid = grid_of(self.world, self.options)
        team, ring = self.mesh.comm("team"), RingComms.of(self.mesh, "subring")
        mine, dtype = grid.coords(self.rank)[0], q_t.dtype
        grad_dtype = self.grad_dtype(q_t)
        k0, v0 = blocks.unpack_kv(kv0)
        dk0, dv0 = blocks.zeros_acc(k0), blocks.zeros_acc(v0)
        sub = grid.subring(self.rank)
        held = grid.block_team(self.rank)

        def compute(parts: list[torch.Tensor], j: int) -> torch.Tensor:  # member j's team queries
            tasks = plan.tasks(grid.coords(sub[j])[0], held)
            return query_backward(parts, k0, v0, tasks, dk0, dv0, self.backend, self.scale)

        # the team gathers dO, D and lse of its queries (one all-gather of one byte buffer)
        buf, specs = pack_bytes([rowsum_delta(dout, out), lse.transpose(1, 2), dout])
        rows = team.all_gather(buf, dim=0).view(team.size, -1)
        got = [unpack_bytes(rows[i].clone(), specs) for i in range(team.size)]
        order = plan.order(mine, dout.device)
        delta_t, lse_t, dout_t = (blocks.permute(torch.cat([m[j] for m in got], dim=1), order)
                                  for j in range(3))
        parts = query_parts(q_t, dout_t, delta_t, lse_t.transpose(1, 2))
        dq_t = query_ring_backward(parts, ring, compute, grad_dtype, plan_of(ring, need_b))
        # dK,dV of the placed block go back to the rank that placed it (Alg. 2 inverse)
        dkv = _place(self.comm, blocks.pack_kv(dk0, dv0).to(grad_dtype),
                     grid.init_recv(self.rank), grid.init_send(self.rank))
        grads = blocks.permute(torch.cat([dq_t.to(grad_dtype), dkv], dim=2),
                               plan.inverse(mine, dout.device))
        dq, dk, dv = team.reduce_scatter(grads, dim=1).split(heads, dim=2)
        return dq.to(dtype), dk.to(dtype), dv.to(dtype)

    @classmethod
    def rank_bytes(cls, shape: AttnShape, world: int, options: Options,
                   rank: int) -> dict[str, int]:
        """Bytes `rank` sends per call: Eq. 6 (collectives) and Eq. 7 (p2p), with GQA heads, lse,
        packing and gradients in the gradient dtype."""
        grid = grid_of(world, options)
        c, t = grid.team_size, grid.ring_size
        u, h, hkv = shape.unit(world), shape.heads, shape.kv_heads
        gu = shape.grad_unit(world, options)
        stats = shape.batch * shape.shard_len(world) * h * shape.acc_bytes  # a shard's lse or D
        block = 2 * c * hkv * u                                   # a team's K,V
        mine = grid.init_send(rank) != rank
        q_block, dq_block = query_block_bytes(shape, world, tokens_factor=c, options=options)
        forward = ((c - 1) * (h + 2 * hkv) * u                   # all-gather q, k, v
                   + (block if mine else 0) + (t - 1) * block     # Alg. 2 placement, sub-ring
                   + (c - 1) * (h * u * shape.acc_bytes // shape.elem_bytes + stats))  # combine
        backward = ((c - 1) * packed_size([stats, stats, h * u])  # all-gather D, lse, dO
                    + query_ring_bytes(q_block, dq_block, t)
                    + (2 * c * hkv * gu if mine else 0)           # placed dK,dV home
                    + (c - 1) * (h + 2 * hkv) * gu)               # reduce-scatter dq, dk, dv
        return {"forward": forward, "backward": backward}

    @classmethod
    def skipped_bytes(cls, shape: AttnShape, world: int, options: Options, rank: int,
                      mask: Mask) -> dict[str, int]:
        """The sub-ring's skipped messages (team collectives and the placement send all)."""
        grid = grid_of(world, options)
        c, t = grid.team_size, grid.ring_size
        if not options.skips(mask.relation) or t == 1:
            return super().skipped_bytes(shape, world, options, rank, mask)
        need_f, need_b = subring_needs(world, options, rank, mask)
        pos = grid.subring(rank).index(rank)
        fwd, bwd = route.plan(t, t, pos, need_f), route.plan(t, t, pos, need_b)
        q_block, dq_block = query_block_bytes(shape, world, tokens_factor=c, options=options)
        return {"forward": skipped_ring_bytes(2 * c * shape.kv_heads * shape.unit(world), 0,
                                              fwd)["forward"],
                "backward": skipped_query_ring_bytes(q_block, dq_block, bwd)}

    @classmethod
    def expected_bytes(cls, shape: AttnShape, world: int, options: Options) -> dict[str, int]:
        """The most any rank sends (every rank that places its block elsewhere)."""
        per_rank = [cls.rank_bytes(shape, world, options, r) for r in range(world)]
        return {p: max(b[p] for b in per_rank) for p in ("forward", "backward")}


def subring_needs(world: int, options: WallFacerOptions, rank: int,
                  mask: Mask) -> tuple[route.Need, route.Need]:
    """need[pos][src] on rank's sub-ring: forward, whether the team at pos sees the K,V block
    placed at src; backward (queries travel), whether the team of src sees the block held at pos."""
    grid = grid_of(world, options)
    teams = wallfacer_grid(world, options).groups("team")
    need = layouts.layout_need(mask.layout, world, mask.seq_len, mask.relation, teams)
    sub = grid.subring(rank)
    team = [grid.coords(x)[0] for x in sub]
    held = [grid.block_team(x) for x in sub]
    ring = range(len(sub))
    return (tuple(tuple(need[team[p]][held[j]] for j in ring) for p in ring),
            tuple(tuple(need[team[j]][held[p]] for j in ring) for p in ring))


def rank_bytes(shape: AttnShape, world: int, options, rank: int) -> dict[str, int]:
    """Module-level alias of WallFacer.rank_bytes (options: a mapping or WallFacerOptions)."""
    return WallFacer.bytes_of_rank(shape, world, options, rank)
