"""Mode `accuracy`: how far an algorithm's forward and backward are from float64.

Every rank draws the same fixed full-sequence inputs (`reference.make_inputs`, from the case's
seed), rounds them to the trial's dtype, takes its shard in the layout and runs the algorithm forward
and backward through the loop (`timing.iterate`). It then computes the reference itself
(`reference.reference` on the same rounded inputs, on its own device, in blocks of query rows:
O(block x N) memory) and compares its shards of out, dq, dk, dv with the reference's rows at its
positions. A rank's error is max |x - ref| over its rows over the whole tensor's `error_scale`; the
trial's error is the max over ranks, which is the relative error of the reassembled tensor. World 1
(`local`) is the plain kernel in that dtype.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from seqpar.algorithms import layouts
from seqpar.algorithms.base import DTYPES
from seqpar.algorithms.comm import Links
from seqpar.algorithms.mesh import Mesh
from seqpar.case import Case
from seqpar.workers.measure.attention import build
from seqpar.workers.measure.record import RankMeasurement, rank_record
from seqpar.workers.measure.reference import GRADS, error_scale, make_inputs, reference
from seqpar.workers.measure.timing import iterate, timed_pass


def rounded_inputs(case: Case) -> dict[str, torch.Tensor]:
    """The case's fixed full inputs (q, k, v, dout) as the trial's dtype holds them."""
    dtype = DTYPES[case.dtype]
    return {name: t.to(dtype) for name, t in make_inputs(case).items()}


def shard_errors(case: Case, rank: int, shards: dict[str, torch.Tensor],
                 ref: dict[str, torch.Tensor]) -> dict[str, float]:
    """This rank's max |x - ref| over its rows, over the whole tensor's error scale, per tensor."""
    pos = layouts.positions(case.layout, rank, case.world, case.seq_len,
                            case.cu_seqlens or None, case.attention_mask)
    out = {}
    for name in GRADS:
        want = ref[name].index_select(1, pos.to(ref[name].device))
        got = shards[name].to(device=want.device, dtype=torch.float64)
        out[name] = float((got - want).abs().max()) / error_scale(ref[name])
    return out


def measure_accuracy(case: Case, rank: int, group: dist.ProcessGroup | None,
                     device: torch.device | str = "cpu", *, nodes: Sequence[int] | None = None,
                     links: Links | None = None, mesh: Mesh | None = None) -> RankMeasurement:
    """The accuracy trial on this rank (see the module docstring); errors in `extra['errors']`."""
    device = torch.device(device)
    attn = build(case, group, mesh, nodes, links)
    full = rounded_inputs(case)
    cu = case.cu_seqlens or None
    local = {name: layouts.shard(t, case.layout, rank, case.world, cu_seqlens=cu,
                                 mask=case.attention_mask).to(device)
             for name, t in full.items()}
    docs = {"cu_seqlens": cu} if cu else {}

    def one_pass() -> tuple[float, float, dict[str, torch.Tensor]]:
        fwd_s, bwd_s, (out, q, k, v) = timed_pass(
            attn, [local[n] for n in ("q", "k", "v")], local["dout"], docs, group, device)
        return fwd_s, bwd_s, {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}

    loop = iterate(one_pass, case.warmup, case.iters, device)
    errors = shard_errors(case, rank, loop.last, reference(case, full, device))
    return rank_record(case, rank, device, loop, extra={"errors": errors})
