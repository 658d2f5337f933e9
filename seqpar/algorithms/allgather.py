"""`allgather`: gather K and V from every rank, attend locally, reduce-scatter dK and dV.

Forward sends (P-1) * 2Hkv * u bytes per rank; backward keeps the gathered K, V and sends only the
reduce-scatter of dK, dV (in the accumulation dtype by default: it sums P contributions):
(P-1)/P * 2Hkv * P * u. The gathered K, V are in rank order; `tokens.gather_plan` decides whether
to sort them into token order (contiguous, zigzag) or plan one call per shard (stripe).

No transfer skipping (skip_transfers changes nothing here): one all-gather brings every shard to
every rank, and gathering only the visible ones would replace it by per-pair point-to-point sends;
the compute of blocks no query sees is skipped as everywhere (`layouts.block_tasks`).
"""

from __future__ import annotations

from seqpar.algorithms import blocks, tokens
from seqpar.algorithms.base import Algorithm
from seqpar.rules.algorithms.allgather import AllGatherRules


class AllGather(AllGatherRules, Algorithm):
    takes_sinks = True

    def plan(self, seq_len: int) -> tokens.GatherPlan:
        holders = (*((r,) for r in range(self.world)), tuple(range(self.world)))
        return tokens.gather_plan(self.layout, self.world, seq_len, holders, self.relation)

    def forward(self, q, k, v):
        plan = self.plan(q.shape[1] * self.world)
        everyone = self.world  # the holding of every rank's shard
        kv = self.comm.all_gather(blocks.pack_kv(k, v), dim=1)  # rank order
        k_all, v_all = blocks.kv_of(blocks.permute(kv, plan.order(everyone, kv.device)), q,
                                    self.backend)
        tasks = plan.tasks(self.rank, everyone)
        out, lse = blocks.attend_tasks(q, k_all, v_all, tasks, self.backend, self.scale)
        out = self.sink(out, lse)
        return out, (q, k_all, v_all, out, lse), plan

    def backward(self, dout, saved, plan):
        q, k_all, v_all, out, lse = saved
        everyone = self.world
        dout, dsinks = self.unsink(dout, out, lse)
        dq, dkv = blocks.grads_tasks(dout, q, k_all, v_all, out, lse,
                                     plan.tasks(self.rank, everyone), self.backend, self.scale,
                                     packed=True)
        dkv = dkv.to(self.grad_dtype(k_all))
        dkv = blocks.permute(dkv, plan.inverse(everyone, dkv.device))  # back to rank order
        dk, dv = blocks.unpack_kv(self.comm.reduce_scatter(dkv, dim=1), q.shape[-1])
        return dq, dk, dv, dsinks
