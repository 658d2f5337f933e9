"""`wallfacer` (WallFacer multi-ring attention, §4.2-4.5): teams of C ranks, sub-rings of P/C² teams.

Forward (Alg. 1): all-gather q, k, v inside the team (`tokens.gather_plan` orders the team's shards
and plans every team-to-team block); send the team's K,V to its Alg. 2 target (`get_init_send`);
P/C² steps of `ring.ring_forward` on the Alg. 3 sub-ring (`get_P2P_config`), each member attending
the team's queries to 1/C of the keys; then an all-to-all of the partial (out, lse) inside the team
and the online-softmax merge of one's own shard's C partials (the bytes of a reduce-scatter; the
partials in the accumulation dtype). Backward (§4.2.1), in one fixed order on every rank: the team
all-gathers (dO, D, lse); K,V stay placed while the team's queries travel the sub-ring with dq one
step behind (`burst.query_ring_backward`); placed blocks' dK,dV return to their placer (Alg. 2
inverted); one reduce-scatter inside the team sums and scatters dq, dk, dv.

The rank grid (mesh.py): collective-intra `(group, subring, team)` puts a team on consecutive ranks,
p2p-intra `(group, team, subring)` a sub-ring; `groups.WallFacerGrid` holds Alg. 2 and 3. A rank
whose Alg. 2 target is itself sends nothing, so bytes differ by rank (`rank_bytes`). With
skip_transfers the sub-rings skip (`route`, `subring_needs`); the team collectives and the
placement send what they send. C = 1, C = sqrt(P), memory (Eq. 9-10) and bytes: docs/algorithms.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from seqpar.algorithms import blocks, tokens
from seqpar.algorithms.base import Algorithm, Geometry
from seqpar.algorithms.burst import (
    pack_bytes,
    query_backward,
    query_parts,
    query_ring_backward,
    rowsum_delta,
    unpack_bytes,
)
from seqpar.algorithms.comm import Comm
from seqpar.algorithms.latent import UpProjection
from seqpar.algorithms.ring import RingComms, plan_of, ring_forward
from seqpar.algorithms.softmax_merge import merge_into
from seqpar.rules import route
from seqpar.rules.algorithms.wallfacer import (  # noqa: F401 (the rules, also from here)
    WallFacerOptions,
    WallFacerRules,
    grid_of,
    rank_bytes,
    subring_needs,
    wallfacer_grid,
)

PLACE_TAG = 31


def _flat_cat(tensors: list[torch.Tensor]) -> torch.Tensor:
    """bshd tensors of any heads and widths side by side per token, (B, s, sum of H x D), so they
    travel in one collective (q, k and v: MLA's v is narrower)."""
    return torch.cat([t.flatten(2) for t in tensors], dim=2)


def _flat_split(t: torch.Tensor, shapes: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """The inverse of `_flat_cat`: views of t as bshd tensors of these (heads, width)."""
    parts = t.split([h * d for h, d in shapes], dim=2)
    return [p.unflatten(2, tuple(s)) for p, s in zip(parts, shapes, strict=True)]








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


class WallFacer(WallFacerRules, Algorithm):
    takes_sinks = True

    def plan(self, seq_len: int) -> tokens.GatherPlan:
        teams = wallfacer_grid(self.world, self.options).groups("team")  # by team index
        return tokens.gather_plan(self.layout, self.world, seq_len, teams, self.relation)

    def needs(self, seq_len: int) -> tuple[route.Need | None, route.Need | None]:
        """need[pos][src] of this rank's sub-ring, forward and backward (None: skip off)."""
        if not self.options.skips(self.relation):
            return None, None
        mask = Geometry(self.layout, seq_len, self.relation)
        return subring_needs(self.world, self.options, self.rank, mask)

    def forward(self, q, k, v):
        return self._forward(q, [k, v])

    def latent_forward(self, q, latent, wkv_b):
        """MLA's latent in place of K,V: gathered, placed and around the sub-ring, each block's
        K,V rebuilt on arrival (`algorithms.latent`)."""
        return self._forward(q, [latent], wkv_b)

    def _forward(self, q, kv, wkv_b=None):
        grid = grid_of(self.world, self.options)
        team, ring = self.mesh.comm("team"), RingComms.of(self.mesh, "subring")
        plan = self.plan(q.shape[1] * self.world)
        need_f, need_b = self.needs(q.shape[1] * self.world)
        mine = grid.coords(self.rank)[0]
        shapes = tuple(t.shape[2:] for t in (q, *kv))  # (heads, width) of each
        # Alg. 1 line 1: the team's q, k, v in one all-gather, then in the plan's order
        gathered = blocks.permute(team.all_gather(_flat_cat([q, *kv]), dim=1),
                                  plan.order(mine, q.device))
        q_t, *kv_t = (t.contiguous() for t in _flat_split(gathered, shapes))
        up = None if wkv_b is None else UpProjection(q_t, kv_t[0], wkv_b)
        # Alg. 2: the team's K,V block to its initial place in the sub-rings
        kv0 = _place(self.comm, blocks.pack_kv(*kv_t) if up is None else kv_t[0],
                     grid.init_send(self.rank), grid.init_recv(self.rank))
        sub = grid.subring(self.rank)

        def tasks_for(j: int):  # the team's queries against the block sub-ring member j placed
            return plan.tasks(mine, grid.block_team(sub[j]))

        acc_out, acc_lse = blocks.new_partial(q_t, kv_t[-1].shape[-1] if up is None else up.v_dim)
        ring_forward(q_t, kv0, ring, tasks_for, acc_out, acc_lse, self.backend, self.scale,
                     plan_of(ring, need_f), fresh=True, rebuild=up)
        out, lse = combine(team, acc_out, acc_lse, plan.inverse(mine, q.device))
        out = self.sink(out, lse).to(q.dtype)
        kept = () if wkv_b is None else (wkv_b,)
        return out, (q_t, kv0, out, lse, *kept), (plan, shapes[0], need_b)

    def backward(self, dout, saved, state):
        return self._backward(dout, saved, state)

    def latent_backward(self, dout, saved, state):
        return self._backward(dout, saved, state)

    def _backward(self, dout, saved, state):
        q_t, kv0, out, lse, *kept = saved
        plan, q_shape, need_b = state
        dout, dsinks = self.unsink(dout, out, lse)
        grid = grid_of(self.world, self.options)
        team, ring = self.mesh.comm("team"), RingComms.of(self.mesh, "subring")
        mine, dtype = grid.coords(self.rank)[0], q_t.dtype
        grad_dtype = self.grad_dtype(q_t)
        up = UpProjection(q_t, kv0, kept[0]) if kept else None  # K,V placed: rebuilt once
        k0, v0 = blocks.unpack_kv(kv0, q_t.shape[-1]) if up is None else up.kv(kv0)
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
        # dK,dV (the latent's gradient) of the placed block go back to the rank that placed it
        # (Alg. 2 inverse)
        d0 = blocks.pack_kv(dk0, dv0) if up is None else up.backward(kv0, dk0, dv0)
        d0 = _place(self.comm, d0.to(grad_dtype), grid.init_recv(self.rank),
                    grid.init_send(self.rank))
        grads = blocks.permute(_flat_cat([dq_t.to(grad_dtype), d0]),
                               plan.inverse(mine, dout.device))
        dq, d0 = _flat_split(team.reduce_scatter(grads, dim=1), (q_shape, kv0.shape[2:]))
        if up is not None:
            return dq.to(dtype), d0, up.dw, dsinks
        dk, dv = blocks.unpack_kv(d0, q_t.shape[-1])
        return dq.to(dtype), dk.to(dtype), dv.to(dtype), dsinks
