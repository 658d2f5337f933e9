"""A trial in mode `accuracy`: how far an algorithm's forward and backward are from float64.

Every rank draws the same fixed full-sequence inputs (`check.make_inputs`, from the case's seed),
rounds them to the trial's dtype, takes its shard in the layout and runs the algorithm forward and
backward (warm-up passes, then `iters` timed ones). It then computes the reference itself: attention
in float64 on the same rounded inputs, in one process, on its own device (SDPA under
`check.reference_mask`, one query head at a time so the N x N scores of one head are held at
once), and compares its shards of out, dq, dk, dv with the reference's rows at its
positions. A rank's error is max |x - ref| over its rows divided by max |ref| over the whole tensor
(at least 1e-4, as `check.evaluate`); the trial's error is the max over ranks, which is the
relative error of the reassembled tensor. World 1 (`local`) is the plain kernel in that dtype.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

from seqpar import algorithms
from seqpar.algorithms import layouts
from seqpar.algorithms.base import DTYPES
from seqpar.algorithms.mesh import Mesh
from seqpar.case import Case
from seqpar.workers.bench import MemoryMeter, RankMeasurement, timed_pass
from seqpar.workers.check import GRADS, make_inputs, reference_mask

SCALE_FLOOR = 1e-4  # a vanishing gradient is held to its absolute error over this (check.evaluate)


def rounded_inputs(case: Case) -> dict[str, torch.Tensor]:
    """The case's fixed full inputs (q, k, v, dout) as the trial's dtype holds them."""
    dtype = DTYPES[case.dtype]
    return {name: t.to(dtype) for name, t in make_inputs(case).items()}


def reference(case: Case, inputs: dict[str, torch.Tensor],
              device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """out, dq, dk, dv (float64, on `device`) of single-process attention on `inputs` under the
    case's mask, one query head at a time (N x N scores of one head held at once); a K,V head's
    gradients sum over its query heads."""
    device = torch.device(device)
    mask = reference_mask(case)
    mask = mask.to(device) if mask is not None else None
    g = case.heads // case.kv_heads
    x = {name: t.to(device=device, dtype=torch.float64) for name, t in inputs.items()}
    outs, dqs = [], []
    dk, dv = torch.zeros_like(x["k"]), torch.zeros_like(x["v"])
    for h in range(case.heads):
        j = h // g  # the K,V head query head h reads (kernels.py: GQA)
        q = x["q"].narrow(2, h, 1).clone().requires_grad_()
        k, v = (x[n].narrow(2, j, 1).clone().requires_grad_() for n in ("k", "v"))
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
            is_causal=case.causal and mask is None).transpose(1, 2)
        out.backward(x["dout"].narrow(2, h, 1))
        outs.append(out.detach())
        dqs.append(q.grad)
        dk.narrow(2, j, 1).add_(k.grad)
        dv.narrow(2, j, 1).add_(v.grad)
    return {"out": torch.cat(outs, dim=2), "dq": torch.cat(dqs, dim=2), "dk": dk, "dv": dv}


def shard_errors(case: Case, rank: int, shards: dict[str, torch.Tensor],
                 ref: dict[str, torch.Tensor]) -> dict[str, float]:
    """This rank's max |x - ref| over its rows, over max |ref| of the whole tensor, per tensor."""
    pos = layouts.positions(case.layout, rank, case.world, case.seq_len,
                            case.cu_seqlens or None)
    out = {}
    for name in GRADS:
        want = ref[name].index_select(1, pos.to(ref[name].device))
        scale = max(float(ref[name].abs().max()), SCALE_FLOOR)
        got = shards[name].to(device=want.device, dtype=torch.float64)
        out[name] = float((got - want).abs().max()) / scale
    return out


def measure_accuracy(case: Case, rank: int, group: dist.ProcessGroup | None,
                     device: torch.device | str = "cpu", *, nodes: Sequence[int] | None = None,
                     mesh: Mesh | None = None) -> RankMeasurement:
    """The accuracy trial on this rank (see the module docstring); errors in `extra['errors']`."""
    device = torch.device(device)
    attn = algorithms.build_attention(case.algorithm, causal=case.causal, layout=case.layout,
                                      group=group, mesh=mesh, nodes=nodes, window=case.window,
                                      **case.option_dict)
    full = rounded_inputs(case)
    cu = case.cu_seqlens or None
    local = {name: layouts.shard(t, case.layout, rank, case.world, cu_seqlens=cu).to(device)
             for name, t in full.items()}
    docs = {"cu_seqlens": cu} if cu else {}

    def one_pass() -> tuple[float, float, dict[str, torch.Tensor]]:
        fwd_s, bwd_s, (out, q, k, v) = timed_pass(
            attn, [local[n] for n in ("q", "k", "v")], local["dout"], docs, group, device)
        shards = {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}
        return fwd_s, bwd_s, shards

    for _ in range(case.warmup):
        one_pass()
    meter = MemoryMeter(device)
    fwd, bwd = [], []
    meter.start()
    with algorithms.recording() as ledger:  # the first timed pass books the ledger
        f, b, shards = one_pass()
    peak = meter.stop()
    fwd.append(f)
    bwd.append(b)
    for _ in range(case.iters - 1):
        f, b, shards = one_pass()
        fwd.append(f)
        bwd.append(b)
    errors = shard_errors(case, rank, shards, reference(case, full, device))
    return RankMeasurement(
        rank=rank, step_ms=[1e3 * (f + b) for f, b in zip(fwd, bwd, strict=True)],
        fwd_ms=[1e3 * f for f in fwd], bwd_ms=[1e3 * b for b in bwd],
        flops=dict(ledger.flops), ledger=ledger.to_dict(),
        bytes_sent={p: ledger.total(phase=p) for p in ("forward", "backward")},
        peak_mem_bytes=peak, mem_method=meter.method, extra={"errors": errors},
    )
