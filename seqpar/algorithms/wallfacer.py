"""`wallfacer` (WallFacer multi-ring attention, §4.2-4.5): teams of C ranks, sub-rings of P/C² teams.

Forward (Alg. 1), in one autograd Function: all-gather q, k, v inside the team (every member then
holds the team's C shards, sorted into token order so that `layouts.block_tasks` can plan any
layout's masks); send the team's K,V to the Alg. 2 target (`get_init_send`), so the team's members
hold different K,V blocks; P/C² steps of `ring.ring_forward` on the Alg. 3 sub-ring
(`get_P2P_config`), each member attending the team's queries to 1/C of the keys; then an all-to-all
of the partial (out, lse) inside the team and the online-softmax merge of the C partials of one's own
shard ("reduce-scatter-combine": the bytes of a reduce-scatter, exact because it is the merge, not a
sum). The partials travel in the accumulation dtype, so lse keeps its precision.

Backward (§4.2.1), same Function, one fixed order on every rank: each member computes
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
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import torch

from seqpar.algorithms import blocks, groups, layouts, ledger
from seqpar.algorithms.base import AlgorithmSpec, AttnShape, Context
from seqpar.algorithms.burst import (
    pack_bytes,
    query_backward,
    query_block_bytes,
    query_parts,
    query_ring_backward,
    query_ring_bytes,
    rowsum_delta,
    unpack_bytes,
)
from seqpar.algorithms.comm import Comm
from seqpar.algorithms.groups import DoubleRing, WallFacerGrid
from seqpar.algorithms.ring import ring_forward
from seqpar.algorithms.softmax_merge import merge

PLACE_TAG = 31
OPTIONS: dict[str, Any] = {"team_size": 1, "placement": "collective-intra"}


def grid_of(world: int, options: Mapping[str, Any]) -> WallFacerGrid:
    return WallFacerGrid(world, options.get("team_size", 1),
                         options.get("placement", "collective-intra"))


@lru_cache(maxsize=1024)
def team_order(layout: str, world: int, seq_len: int,
               members: tuple[int, ...]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(order, inverse): `order` sorts the team's gathered shards into token order (None: sorted)."""
    pos = torch.cat([layouts.positions(layout, r, world, seq_len) for r in members])
    order = layouts.sort_order(pos)
    if order is None:
        return None, None
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel())
    return order, inverse


@lru_cache(maxsize=4096)
def team_tasks(layout: str, world: int, seq_len: int, q_members: tuple[int, ...],
               k_members: tuple[int, ...], causal: bool) -> tuple[layouts.Task, ...]:
    """Kernel calls for one team's queries against another team's K,V block (both token order)."""
    def pos(members):
        return torch.sort(torch.cat([layouts.positions(layout, r, world, seq_len)
                                     for r in members])).values
    return layouts.block_tasks(pos(q_members), pos(k_members), causal)


def _permute(t: torch.Tensor, index: torch.Tensor | None, dim: int = 1) -> torch.Tensor:
    return t if index is None else t.index_select(dim, index.to(t.device))


def _place(comm: Comm, t: torch.Tensor, to: int, frm: int) -> torch.Tensor:
    """Send t to `to` and receive its like from `frm`; nothing moves when both are this rank."""
    if to == comm.rank:
        return t
    (got,) = comm.exchange([(t, to)], [(torch.empty_like(t), frm)], tag=PLACE_TAG).wait()
    return got


def _comms(c: Context, grid: WallFacerGrid) -> tuple[Comm, Comm]:
    """This rank's team and sub-ring (created once, then cached by groups.subgroup)."""
    team = groups.subgroup(c.comm, grid.team(c.rank), "team")
    ring = groups.subgroup(c.comm, grid.subring(c.rank), "subring")
    assert team.rank == grid.coords(c.rank)[1], "team rank must be the member coordinate"
    assert grid.subring(c.rank)[ring.rank] == c.rank, "sub-ring rank must be the ring position"
    return team, ring


def setup(c: Context) -> None:
    """At build time, on every rank: check C and the placement, create the team and sub-ring."""
    _comms(c, grid_of(c.world, c.options))


def combine(team: Comm, acc_out: torch.Tensor, acc_lse: torch.Tensor,
            inverse: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Reduce-scatter-combine: each member gets the C partials of its own shard and merges them."""
    b, _, h, d = acc_out.shape
    out_m = _permute(acc_out, inverse)
    lse_m = _permute(acc_lse.transpose(1, 2), inverse)  # (B, C*s, H): scatter along tokens
    outs, lses = team.all_to_all([out_m, lse_m], scatter_dim=1, gather_dim=0)
    g = team.size
    outs, lses = outs.view(g, b, -1, h, d), lses.view(g, b, -1, h)
    out, lse = outs[0], lses[0].transpose(1, 2)
    for i in range(1, g):
        out, lse = merge(out, lse, outs[i], lses[i].transpose(1, 2))
    return out, lse.contiguous()


class _WallFacerAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, c: Context):
        grid = grid_of(c.world, c.options)
        team, ring = _comms(c, grid)
        seq_len, heads = q.shape[1] * c.world, (q.shape[2], k.shape[2], v.shape[2])
        members = tuple(grid.team(c.rank))
        order, inverse = team_order(c.layout, c.world, seq_len, members)
        # Alg. 1 line 1: the team's q, k, v, one all-gather, then token order
        qkv = _permute(team.all_gather(torch.cat([q, k, v], dim=2), dim=1), order)
        q_t, k_t, v_t = (t.contiguous() for t in qkv.split(heads, dim=2))
        # Alg. 2: the team's K,V block to its initial place in the sub-rings
        dst, src = grid.init_send(c.rank), grid.init_recv(c.rank)
        place = c.comm.relabel("placement")
        kv0 = _place(place, blocks.pack_kv(k_t, v_t), dst, src)
        sub = grid.subring(c.rank)

        def tasks_for(j: int):  # the team's queries against the block sub-ring member j placed
            held = tuple(grid.members(grid.block_team(sub[j])))
            return team_tasks(c.layout, c.world, seq_len, members, held, c.causal)

        acc_out, acc_lse = blocks.new_partial(q_t)
        ring_forward(q_t, kv0, ring, tasks_for, acc_out, acc_lse, c.backend, c.scale)
        out, lse = combine(team, acc_out, acc_lse, inverse)
        out = out.to(q.dtype)
        ctx.c, ctx.grid, ctx.comms, ctx.place = c, grid, (team, ring), place
        ctx.order, ctx.inverse, ctx.heads, ctx.ledgers = order, inverse, heads, ledger.active()
        ctx.save_for_backward(q_t, kv0, out, lse)
        return out

    @staticmethod
    def backward(ctx, dout):
        q_t, kv0, out, lse = ctx.saved_tensors
        c, grid, (team, ring) = ctx.c, ctx.grid, ctx.comms
        seq_len, dtype = q_t.shape[1] // team.size * c.world, q_t.dtype
        k0, v0 = blocks.unpack_kv(kv0)
        dk0, dv0 = blocks.zeros_acc(k0), blocks.zeros_acc(v0)
        sub = grid.subring(c.rank)
        held = tuple(grid.members(grid.block_team(c.rank)))

        def compute(parts: list[torch.Tensor], j: int) -> torch.Tensor:  # queries of member j's team
            q_members = tuple(grid.team(sub[j]))
            tasks = team_tasks(c.layout, c.world, seq_len, q_members, held, c.causal)
            return query_backward(parts, k0, v0, tasks, dk0, dv0, c.backend, c.scale)

        dout = dout.contiguous()
        with ledger.backward_of(ctx.ledgers):
            # the team gathers dO, D and lse of its queries (one all-gather of one byte buffer)
            buf, specs = pack_bytes([rowsum_delta(dout, out), lse.transpose(1, 2), dout])
            rows = team.all_gather(buf, dim=0).view(team.size, -1)
            mine = [unpack_bytes(rows[i].clone(), specs) for i in range(team.size)]
            delta_t, lse_t, dout_t = (_permute(torch.cat([m[j] for m in mine], dim=1), ctx.order)
                                      for j in range(3))
            parts = query_parts(q_t, dout_t, delta_t, lse_t.transpose(1, 2))
            dq_t = query_ring_backward(parts, ring, DoubleRing(ring.size, ring.size, ring.rank),
                                       compute, dtype)
            # dK,dV of the placed block go back to the rank that placed it (Alg. 2 inverse)
            dkv = _place(ctx.place, blocks.pack_kv(dk0, dv0).to(dtype),
                         grid.init_recv(c.rank), grid.init_send(c.rank))
            grads = _permute(torch.cat([dq_t.to(dtype), dkv], dim=2), ctx.inverse)
            dq, dk, dv = team.reduce_scatter(grads, dim=1).split(ctx.heads, dim=2)
        return dq.contiguous(), dk.contiguous(), dv.contiguous(), None


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, c: Context) -> torch.Tensor:
    return _WallFacerAttention.apply(q, k, v, c)


def rules(shape: AttnShape, world: int, options: Mapping[str, Any]) -> None:
    grid_of(world, options)  # 1 <= C <= sqrt(P), C² | P, a known placement


def rank_bytes(shape: AttnShape, world: int, options: Mapping[str, Any],
               rank: int) -> dict[str, int]:
    """Bytes `rank` sends per call: Eq. 6 (collectives) and Eq. 7 (p2p), with GQA heads and lse."""
    grid = grid_of(world, options)
    c, t = grid.team_size, grid.ring_size
    u, h, hkv = shape.unit(world), shape.heads, shape.kv_heads
    acc = 8 if shape.elem_bytes == 8 else 4
    stats = shape.batch * (shape.seq_len // world) * h * acc  # one shard's lse (or D)
    block = 2 * c * hkv * u                                   # a team's K,V
    placed = block if grid.init_send(rank) != rank else 0
    q_block, dq_block = query_block_bytes(shape, world, tokens_factor=c)
    forward = ((c - 1) * (h + 2 * hkv) * u           # all-gather q, k, v
               + placed + (t - 1) * block             # Alg. 2 placement, sub-ring steps
               + (c - 1) * (h * u * acc // shape.elem_bytes + stats))  # combine (out, lse)
    backward = ((c - 1) * (h * u + 2 * stats)         # all-gather dO, D, lse
                + query_ring_bytes(q_block, dq_block, t) + placed
                + (c - 1) * (h + 2 * hkv) * u)        # reduce-scatter dq, dk, dv
    return {"forward": forward, "backward": backward}


def expected_bytes(shape: AttnShape, world: int, options: Mapping[str, Any]) -> dict[str, int]:
    """The most any rank sends (every rank that places its block elsewhere)."""
    per_rank = [rank_bytes(shape, world, options, r) for r in range(world)]
    return {p: max(b[p] for b in per_rank) for p in ("forward", "backward")}


SPEC = AlgorithmSpec(
    "wallfacer", "teams of C gather q,k,v; P/C² sub-ring steps of team K,V blocks; "
    "reduce-scatter-combine; backward moves the team's queries", run, rules, expected_bytes,
    options=OPTIONS, setup=setup, rank_bytes=rank_bytes)
