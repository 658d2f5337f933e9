"""`usp` (LoongTrain 2D-Attention, §4.1, Alg. 1): P = dhp x dcp ranks, an all-to-all inside each
head-parallel (HP) group around (double) ring attention inside each context-parallel (CP) group.

The rank grid (mesh.py): head-first `(outer, inner, hp)` or context-first `(hp, outer, inner)`, with
cp = outer x inner (§4.4); each axis is a process group of its own. Forward: K,V heads replicated to
dhp when kv_heads < dhp (§4.2); one all-to-all turns q, k, v into H/dhp-head shards of the HP group's
tokens; `ring.ring_forward` over the CP group with inner rings of `inner_ring`; one all-to-all
brings out back. Backward, in one fixed order on every rank: all-to-all of dout,
`ring.ring_backward`, one all-to-all of dq, dk, dv; the replicas' dK,dV summed.

After the all-to-all a rank holds its HP group's shards in member order: `tokens.gather_plan` decides
whether to permute them into token order and plans every inner-ring block from it, so every layout
and placement is exact without re-dealing the input. K,V heads that neither split nor replicate over
dhp (H=6, Hkv=3, dhp=2) go as ulysses sends them (`ulysses.kv_ranges`): each member receives the
K,V heads its query heads read, expands them for its kernel calls only, and sends the summed
gradients home. With skip_transfers only the context ring skips (`route`). `double_ring` is
dhp = 1; dhp = 1 is exactly `ring`, dcp = 1 exactly `ulysses`. Schedules and bytes:
docs/algorithms.md.
"""

from __future__ import annotations

from seqpar.algorithms import blocks, layouts, tokens
from seqpar.algorithms.base import Algorithm
from seqpar.algorithms.latent import UpProjection
from seqpar.algorithms.ring import (
    RingComms,
    plan_of,
    ring_backward,
    ring_forward,
)
from seqpar.algorithms.ulysses import (
    head_shard,
    heads_to_seq,
    kv_grads_to_seq,
    kv_to_heads,
    local_kv_index,
    replicate_kv,
    seq_to_heads,
    sum_replicas,
)
from seqpar.rules import route
from seqpar.rules.algorithms.ulysses import kv_ranges, kv_replicas
from seqpar.rules.algorithms.usp import (  # noqa: F401 (the rules, also from here)
    UspOptions,
    UspRules,
    bytes_by_op,
    grid_of,
    ring_kv_heads,
    usp_grid,
)


class Usp(UspRules, Algorithm):
    takes_sinks = True

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

        acc_out, acc_lse = blocks.new_partial(qh, vh.shape[-1])
        ring_forward(qh, kv, comms, tasks_for, acc_out, acc_lse, self.backend, self.scale, path,
                     kv_index, fresh=True)
        out_h = self.sink(acc_out, acc_lse, head_shard(hp, qh.shape[2])).to(q.dtype)
        (out,) = heads_to_seq([out_h], hp, plan.inverse(me, q.device))
        return out, (qh, kv, out_h, acc_lse), (plan, me, undo, tasks_for, path, kv_index)

    def backward(self, dout, saved, state):
        qh, kv, out_h, lse = saved
        plan, me, undo, tasks_for, path, kv_index = state
        hp, comms = self.mesh.comm("hp"), RingComms.of(self.mesh, "cp")
        dq = blocks.zeros_acc(qh)
        # one fixed order on every rank: a2a, ring (K,V then dK,dV), a2a
        (doh,) = seq_to_heads([dout], hp, plan.order(me, dout.device))
        doh, dsinks = self.unsink(doh, out_h, lse, head_shard(hp, qh.shape[2]))
        dkv = ring_backward(doh, qh, kv, out_h, lse, comms, tasks_for, dq, self.backend,
                            self.scale, self.grad_dtype(qh), path, kv_index)
        dkh, dvh = blocks.unpack_kv(dkv.to(qh.dtype), qh.shape[-1])
        inverse = plan.inverse(me, dout.device)
        if kv_index is None:
            dq, dk, dv = heads_to_seq([dq.to(qh.dtype), dkh, dvh], hp, inverse)
            dk, dv = sum_replicas(dk, dv, undo)
        else:
            ranges, kv_heads = undo
            (dq,) = heads_to_seq([dq.to(qh.dtype)], hp, inverse)
            dk, dv = kv_grads_to_seq(dkh, dvh, hp, ranges, inverse, kv_heads)
        return dq, dk, dv, dsinks

    # -- MLA with the latent on the context ring (mla_pass latent, `algorithms.latent`) ----------
    def latent_forward(self, q, latent, wkv_b):
        """q to head shards as ever; the latent, one head every query head reads, all-gathered
        over HP instead; the HP group's latents travel the context ring, and each member rebuilds
        its own heads' K,V from them (its rows of wkv_b)."""
        hp, comms = self.mesh.comm("hp"), RingComms.of(self.mesh, "cp")
        me, n = comms.ring.rank, q.shape[1] * self.world
        plan, path = self.plan(n), plan_of(comms, self.need(n))
        order = plan.order(me, q.device)
        (qh,) = seq_to_heads([q], hp, order)
        lat = blocks.permute(hp.all_gather(latent, dim=1), order)
        up = UpProjection(qh, lat, wkv_b, hp.rank, hp.size)

        def tasks_for(src: int):
            return plan.tasks(me, src)

        acc_out, acc_lse = blocks.new_partial(qh, up.v_dim)
        ring_forward(qh, lat, comms, tasks_for, acc_out, acc_lse, self.backend, self.scale, path,
                     fresh=True, rebuild=up)
        out_h = self.sink(acc_out, acc_lse, head_shard(hp, qh.shape[2])).to(q.dtype)
        (out,) = heads_to_seq([out_h], hp, plan.inverse(me, q.device))
        return out, (qh, lat, wkv_b, out_h, acc_lse), (plan, me, tasks_for, path)

    def latent_backward(self, dout, saved, state):
        qh, lat, wkv_b, out_h, lse = saved
        plan, me, tasks_for, path = state
        hp, comms = self.mesh.comm("hp"), RingComms.of(self.mesh, "cp")
        dq, up = blocks.zeros_acc(qh), UpProjection(qh, lat, wkv_b, hp.rank, hp.size)
        # one fixed order on every rank: a2a, ring (latent then its gradient), a2a, reduce-scatter
        (doh,) = seq_to_heads([dout], hp, plan.order(me, dout.device))
        doh, dsinks = self.unsink(doh, out_h, lse, head_shard(hp, qh.shape[2]))
        dlat = ring_backward(doh, qh, lat, out_h, lse, comms, tasks_for, dq, self.backend,
                             self.scale, self.grad_dtype(qh), path, rebuild=up)
        inverse = plan.inverse(me, dout.device)
        (dq,) = heads_to_seq([dq.to(qh.dtype)], hp, inverse)
        dlatent = hp.reduce_scatter(blocks.permute(dlat, inverse), dim=1)
        return dq, dlatent, up.dw, dsinks




