"""`usp` (LoongTrain 2D-Attention): P = dhp x dcp ranks, all-to-all inside each head-parallel (HP)
group, (double) ring attention inside each context-parallel (CP) group (LoongTrain §4.1, Alg. 1).

Forward, in one autograd Function: K,V heads replicated to dhp when kv_heads < dhp (§4.2); one
all-to-all in the HP group turns q, k, v from sequence shards into H/dhp-head shards of the HP
group's tokens; the CP group runs `ring.ring_forward` on them with inner rings of `inner_ring` = w
(w < dcp: Double-Ring-Attention, Alg. 2, with the outer-ring prefetch of the next inner ring's first
K,V overlapping the inner ring); one all-to-all brings out back. Backward, from the same Function and
in one fixed order on every rank: all-to-all of dout, `ring.ring_backward` (K,V and their dK,dV
travel), one all-to-all of dq, dk, dv; replicas' dK,dV summed. The groups are pure rank maths from
one grid in `groups.py` (`usp_grid`, placement head-first | context-first, §4.4 Fig. 11).

Token order (LoongTrain's data-loader post-processing, §4.4) lives here, in `token_plan`: after the
all-to-all a rank holds its HP group members' shards concatenated in rank order, which for zigzag,
stripe or context-first placement is not token order. `token_plan` gives the permutation into token
order (a local index_select right after the all-to-all, undone right before the all-to-all back; no
communication) and the sorted positions of every CP position's union shard, from which
`layouts.block_tasks` plans each inner-ring block's causal masks. So every layout and placement is
exact without re-dealing the input between ranks, which LoongTrain does in its data loader.

`double_ring` (double_ring.py) is the dhp = 1 case. dhp = 1 is exactly `ring`, dcp = 1 exactly
`ulysses`: the same kernel calls, the same bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import torch

from seqpar.algorithms import blocks, groups, layouts, ledger
from seqpar.algorithms.base import AlgorithmSpec, AttnShape, Context, divides
from seqpar.algorithms.comm import Comm
from seqpar.algorithms.ring import ring_backward, ring_bytes, ring_forward
from seqpar.algorithms.ulysses import (
    check_kv_split,
    gathered_positions,
    heads_to_seq,
    kv_replicas,
    replicate_kv,
    seq_alltoall_bytes,
    seq_to_heads,
    sum_replicas,
)
from seqpar.errors import require

OPTIONS: dict[str, Any] = {"dhp": 1, "dcp": None, "placement": "head-first", "inner_ring": None}


def grid_of(world: int, options: Mapping[str, Any]) -> tuple[int, int, str, int]:
    """(dhp, dcp, placement, inner ring w) after the world-level rules; dcp defaults to P/dhp and
    w to dcp (one inner ring: the plain ring)."""
    dhp = options.get("dhp", 1)
    require(isinstance(dhp, int) and dhp >= 1 and world % dhp == 0, "dhp", dhp,
            f"must be a positive divisor of the world size ({world})")
    dcp = options.get("dcp")
    dcp = world // dhp if dcp is None else dcp
    require(isinstance(dcp, int) and dhp * dcp == world, "dcp", dcp,
            f"dhp * dcp must equal the world size ({world}) with dhp={dhp}")
    placement = options.get("placement", "head-first")
    require(placement in groups.PLACEMENTS, "placement", placement,
            f"must be one of {', '.join(groups.PLACEMENTS)}")
    inner = options.get("inner_ring")
    inner = dcp if inner is None else inner
    require(isinstance(inner, int) and inner >= 1 and dcp % inner == 0, "inner_ring", inner,
            f"must be a positive divisor of dcp ({dcp})")
    return dhp, dcp, placement, inner


@lru_cache(maxsize=1024)
def token_plan(layout: str, world: int, seq_len: int, dhp: int, dcp: int, placement: str,
               cp_pos: int) -> tuple[torch.Tensor | None, tuple[torch.Tensor, ...]]:
    """(order, positions): `order` sorts the tokens gathered by the all-to-all of the HP group at
    CP position `cp_pos` into token order (None: already sorted); positions[b] are the sorted
    token positions CP position b holds after it, for every b (what the inner ring's masks need)."""
    hp_groups = groups.usp_hp_groups(dhp, dcp, placement)
    gathered = [gathered_positions(layout, world, seq_len, members) for members in hp_groups]
    return (layouts.sort_order(gathered[cp_pos]),
            tuple(torch.sort(pos).values for pos in gathered))


@lru_cache(maxsize=4096)
def _cp_tasks(layout: str, world: int, seq_len: int, dhp: int, dcp: int, placement: str,
              q_pos: int, k_pos: int, causal: bool) -> tuple[layouts.Task, ...]:
    _, pos = token_plan(layout, world, seq_len, dhp, dcp, placement, q_pos)
    return layouts.block_tasks(pos[q_pos], pos[k_pos], causal)


def _comms(c: Context, dhp: int, dcp: int, placement: str) -> tuple[Comm, Comm]:
    """This rank's HP and CP groups: views of the sequence-parallel group (groups.subgroup)."""
    a, b = groups.usp_coords(c.rank, dhp, dcp, placement)
    hp = groups.subgroup(c.comm, groups.usp_hp_groups(dhp, dcp, placement)[b], "hp")
    cp = groups.subgroup(c.comm, groups.usp_cp_groups(dhp, dcp, placement)[a], "cp")
    assert hp.rank == a and cp.rank == b, "group ranks must be grid coordinates"
    return hp, cp


def setup(c: Context) -> None:
    """At build time, on every rank: a bad grid fails here, before any byte moves."""
    dhp, dcp, placement, _ = grid_of(c.world, c.options)
    _comms(c, dhp, dcp, placement)


class _UspAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, c: Context):
        dhp, dcp, placement, inner = grid_of(c.world, c.options)
        hp, cp = _comms(c, dhp, dcp, placement)
        seq_len = q.shape[1] * c.world
        order, _ = token_plan(c.layout, c.world, seq_len, dhp, dcp, placement, cp.rank)

        def tasks_for(src: int):
            return _cp_tasks(c.layout, c.world, seq_len, dhp, dcp, placement, cp.rank, src,
                             c.causal)

        reps = kv_replicas(k.shape[2], dhp)
        k, v = replicate_kv(k, v, reps)
        qh, kh, vh = seq_to_heads([q, k, v], hp, order)
        kv = blocks.pack_kv(kh, vh)
        acc_out, acc_lse = blocks.new_partial(qh)
        ring_forward(qh, kv, cp, tasks_for, acc_out, acc_lse, c.backend, c.scale, inner=inner)
        out_h = acc_out.to(q.dtype)
        (out,) = heads_to_seq([out_h], hp, order)
        ctx.c, ctx.comms, ctx.order, ctx.reps, ctx.inner = c, (hp, cp), order, reps, inner
        ctx.tasks_for, ctx.ledgers = tasks_for, ledger.active()
        ctx.save_for_backward(qh, kv, out_h, acc_lse)
        return out

    @staticmethod
    def backward(ctx, dout):
        qh, kv, out_h, lse = ctx.saved_tensors
        c, (hp, cp) = ctx.c, ctx.comms
        dq = blocks.zeros_acc(qh)
        # one Function, one fixed order on every rank: a2a, ring (K,V then dK,dV), a2a
        with ledger.backward_of(ctx.ledgers):
            (doh,) = seq_to_heads([dout.contiguous()], hp, ctx.order)
            dkv = ring_backward(doh, qh, kv, out_h, lse, cp, ctx.tasks_for, dq, c.backend,
                                c.scale, inner=ctx.inner)
            dkh, dvh = blocks.unpack_kv(dkv.to(qh.dtype))
            dq, dk, dv = heads_to_seq([dq.to(qh.dtype), dkh, dvh], hp, ctx.order)
        dk, dv = sum_replicas(dk, dv, ctx.reps)
        return dq, dk, dv, None


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, c: Context) -> torch.Tensor:
    return _UspAttention.apply(q, k, v, c)


def rules(shape: AttnShape, world: int, options: Mapping[str, Any]) -> None:
    dhp, _, _, _ = grid_of(world, options)
    divides("heads", shape.heads, dhp, "dhp")
    check_kv_split(shape.kv_heads, dhp, "dhp")


def bytes_by_op(shape: AttnShape, world: int, options: Mapping[str, Any]) -> dict[str, dict]:
    """Analytic bytes one rank sends per phase and op (LoongTrain §4.5.3-4.5.4).

    all_to_all: AlltoAll_Volume = (dhp-1)/dhp x (Size(q) + Size(k) + Size(v) + Size(out)), with
    K,V replicated to max(Hkv, dhp) heads, in each phase. p2p: Size(kv) = 2·max(Hkv, dhp)·u per
    message (H/dhp heads of N/dcp tokens); dcp-1 messages forward (inner and outer rings together),
    and backward dcp-1 for K,V plus dcp for dK,dV, as in the plain ring of dcp.
    """
    dhp, dcp, _, _ = grid_of(world, options)
    kv_heads = shape.kv_heads * kv_replicas(shape.kv_heads, dhp)
    a2a = seq_alltoall_bytes(shape, dhp, world, kv_heads)
    p2p = ring_bytes(2 * kv_heads * shape.unit(world), dcp)
    return {phase: {"all_to_all": a2a, "p2p": p2p[phase]} for phase in ledger.PHASES}


def expected_bytes(shape: AttnShape, world: int, options: Mapping[str, Any]) -> dict[str, int]:
    return {phase: sum(ops.values()) for phase, ops in bytes_by_op(shape, world, options).items()}


SPEC = AlgorithmSpec(
    "usp", "LoongTrain 2D: all-to-all in head-parallel groups, (double) ring in context groups",
    run, rules, expected_bytes, options=OPTIONS, setup=setup)
