"""Training steps of the model on one rank: AdamW on seeded synthetic token batches (or packed
documents of a text file), warm-up, timed steps, and the metrics the papers report, per step and rank.

    case = TrainCase(algorithm="ring", sp=4, seq_len=1024, states="fsdp", dtype="bfloat16",
                     master_dtype="float32")
    out = train_steps(case, rank, sp_group, dp_group=None, device=torch.device("cuda", 0))
    out.steps[i]["step_s"], out.summary["tgs"], out.summary["mfu_halved"], ...

The model, its states and every batch live on the rank's device; every timestamp follows a device
sync, so the clock sees the kernels and not their enqueue. Metrics: step time, tokens/s (whole DP x
SP job), TGS (tokens per device per second), model FLOP/s per device and MFU under both FLOP
conventions (`model.flops`; MFU only where the device's peak is known), peak memory over one
untimed step (`meters.MemoryMeter`: the CUDA allocator's peak on a GPU), the bytes of model states
this rank holds (`model.memory.state_bytes`), activation bytes kept for backward (`model.memory.
AllocationMeter` over one forward, on the device), FLOPs the checkpointing mode recomputes, the loss
of every step, and attention bytes by (op, link, phase) from the ledger, links by the trial's node
map. `gang_train` runs it on a LocalGang rank (tests, `python -m seqpar.workers.measure.train`).
"""

from __future__ import annotations

import functools
import gc
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from seqpar import algorithms
from seqpar.algorithms.base import DTYPES
from seqpar.algorithms.comm import Links
from seqpar.case import TrainCase
from seqpar.model import Transformer
from seqpar.model import flops as model_flops
from seqpar.model.memory import AllocationMeter, state_bytes
from seqpar.model.text import TextData
from seqpar.platform.devices import peak_flops
from seqpar.workers.measure.meters import MemoryMeter
from seqpar.workers.measure.noise import NoiseMeter
from seqpar.workers.measure.record import RankMeasurement
from seqpar.workers.measure.timing import sync


@dataclass
class TrainResult:
    rank: int
    steps: list[dict[str, float]]
    summary: dict[str, Any]
    losses: list[float]          # every step's loss, warm-up included, in order
    ledger: algorithms.Ledger = field(default_factory=algorithms.Ledger)
    mem_method: str = "rss-hwm-delta"
    noise: dict[str, Any] = field(default_factory=dict)  # the host over the timed steps


@functools.lru_cache(maxsize=4)
def _text(path: str, separator: str) -> TextData:
    return TextData.load(path, separator)


def batch_tokens(case: TrainCase, step: int, replica: int
                 ) -> tuple[torch.Tensor, tuple[int, ...] | None]:
    """The (batch, N + 1) batch of `replica` at `step`, the same on every SP rank, and its packed
    documents' boundaries (None for random tokens, drawn from the seed)."""
    if case.text is not None:
        return _text(case.text, case.text_separator).batch(step * case.dp + replica, case.seq_len)
    gen = torch.Generator().manual_seed(case.seed * 1_000_003 + step * 1_009 + replica)
    return torch.randint(0, case.config().vocab, (case.batch, case.seq_len + 1), generator=gen), None


def build(case: TrainCase, sp_group: dist.ProcessGroup | None,
          dp_group: dist.ProcessGroup | None = None, mesh: algorithms.Mesh | None = None,
          device: torch.device | str = "cpu") -> Transformer:
    policy = case.state_policy()
    return Transformer(case.config(), attention=case.algorithm, layout=case.layout, group=sp_group,
                       dp_group=dp_group, checkpoint=case.checkpoint, seq_fraction=case.seq_fraction,
                       fused_head=case.fused_head, head_tiles=case.head_tiles, seed=case.seed,
                       dtype=DTYPES[case.dtype], mesh=mesh, master_dtype=policy.master_dtype,
                       states=policy.states, offload=policy.offload, device=device,
                       **dict(case.options))


def train_steps(case: TrainCase, rank: int, sp_group: dist.ProcessGroup | None,
                dp_group: dist.ProcessGroup | None = None, replica: int = 0,
                device_name: str = "cpu", mesh: algorithms.Mesh | None = None,
                device: torch.device | str = "cpu", node_of_rank: Sequence[int] | None = None
                ) -> TrainResult:
    """Warm-up, then `iters` timed AdamW steps on this rank; metrics per step and a summary.
    With `mesh` (DP x SP), the groups come from it; `node_of_rank` classes the ledger's links."""
    device = torch.device(device)
    cfg = case.config()
    net = build(case, sp_group, dp_group, mesh, device)
    sp_group = net.group
    opt = torch.optim.AdamW(net.parameters(), lr=case.lr)
    losses: list[float] = []
    held: list[int] = []

    def step(i: int) -> tuple[float, float]:
        tokens, cu = batch_tokens(case, i, replica)
        tokens = tokens.to(device, non_blocking=True)
        if sp_group is not None:
            dist.barrier(group=sp_group)
        sync(device)
        t0 = time.perf_counter()
        loss = net.loss(tokens, cu)
        sync(device)
        t1 = time.perf_counter()
        loss.backward()
        opt.step()
        if not held:  # parameters, gradients and moments all alive here
            held.append(state_bytes(net, opt))
        opt.zero_grad(set_to_none=True)
        sync(device)
        t2 = time.perf_counter()
        losses.append(loss.item())
        return t1 - t0, t2 - t1

    meter = MemoryMeter(device)
    for i in range(max(case.warmup - 1, 0)):
        step(i)
    meter.start()
    step(max(case.warmup - 1, 0))
    peak = meter.stop()
    peak_device = peak_flops(device_name, case.dtype)
    steps = []
    recorded = None
    noise = NoiseMeter()
    noise.start()
    for i in range(case.iters):
        if i == 0:
            with algorithms.recording(node_of_rank) as recorded:
                fwd, bwd = step(case.warmup + i)
        else:
            fwd, bwd = step(case.warmup + i)
        steps.append(step_metrics(case, fwd + bwd, peak_device) | {"fwd_s": fwd, "bwd_s": bwd})
    noise.stop()
    # activation bytes: one more forward, outside the timed steps (the profiler slows it)
    gc.collect()
    tokens, cu = batch_tokens(case, 0, replica)
    with AllocationMeter(device) as mem:
        loss = net.loss(tokens.to(device), cu)
    del loss
    net.zero_grad(set_to_none=True)
    summary: dict[str, Any] = {k: sorted(r[k] for r in steps)[len(steps) // 2] for k in steps[0]}
    summary.update(peak_mem_bytes=peak, activation_bytes=mem.retained, state_bytes=held[0],
                   recomputed_flops=model_flops.recomputed_flops(
                       cfg, case.batch, case.seq_len, case.sp, case.checkpoint, case.seq_fraction),
                   params=cfg.params(), loss_last=losses[-1])
    assert recorded is not None
    return TrainResult(rank, steps, summary, losses, recorded, meter.method, noise.sample)


def step_metrics(case: TrainCase, step_s: float, peak_device: float | None) -> dict[str, float]:
    """Throughput of one step of the whole DP x SP job: tokens/s, TGS, model FLOP/s per device and
    MFU in both conventions (MFU only with a known device peak)."""
    cfg, world = case.config(), case.world
    tokens = case.batch * case.seq_len * case.dp
    row = {"step_s": step_s, "tokens_per_s": tokens / step_s, "tgs": tokens / step_s / world}
    for conv in model_flops.CONVENTIONS:
        per_device = model_flops.step_flops(cfg, case.batch * case.dp, case.seq_len, conv) / world
        row[f"model_flops_per_s_{conv}"] = per_device / step_s
        if peak_device is not None:
            row[f"mfu_{conv}"] = per_device / step_s / peak_device
    return row


def dp_sp_mesh(case: TrainCase, nodes: Sequence[int] | None = None,
               links: Links | None = None) -> algorithms.Mesh:
    """The trial's DP x SP mesh: the attention's rank grid per replica, replica d on ranks
    [d*sp, (d+1)*sp), built on every rank of the world (algorithms.mesh_for)."""
    return algorithms.mesh_for(case.algorithm, case.sp, dp=case.dp, nodes=nodes, links=links,
                               **dict(case.options))


def measure_training(case: TrainCase, rank: int, device_name: str = "cpu",
                     device: torch.device | str = "cpu", nodes: Sequence[int] | None = None,
                     links: Links | None = None) -> RankMeasurement:
    """`train_steps` on a rank of an initialised world of sp x dp ranks, as a RankMeasurement (the
    Ray rank worker's currency); the training metrics ride in `extra`. `nodes`: each rank's node
    (the trial's node map: link classes, burst's and usp's node-aware rings); `links`: the link
    classes to emulate."""
    mesh = dp_sp_mesh(case, nodes, links)
    replica = mesh.coord("dp") if "dp" in mesh.comms else 0
    out = train_steps(case, rank, None, None, replica, device_name, mesh=mesh, device=device,
                      node_of_rank=nodes)
    ledger = out.ledger
    return RankMeasurement(
        rank=rank, step_ms=[1e3 * r["step_s"] for r in out.steps],
        fwd_ms=[1e3 * r["fwd_s"] for r in out.steps], bwd_ms=[1e3 * r["bwd_s"] for r in out.steps],
        flops=dict(ledger.flops), ledger=ledger.to_dict(),
        bytes_sent={p: ledger.total(phase=p) for p in ("forward", "backward")},
        peak_mem_bytes=out.summary["peak_mem_bytes"], mem_method=out.mem_method, noise=out.noise,
        extra={"train": {k: v for k, v in out.summary.items() if k != "peak_mem_bytes"},
               "losses": out.losses})


def train_metrics(case: TrainCase, per_rank: list[RankMeasurement], step_ms: float,
                  device_name: str) -> dict[str, float]:
    """The training headline numbers of a trial (step time: the slowest rank's median)."""
    out = step_metrics(case, step_ms / 1e3, peak_flops(device_name, case.dtype))
    out.pop("step_s")
    summaries = [m.extra.get("train", {}) for m in per_rank]
    for key in ("activation_bytes", "state_bytes", "recomputed_flops", "loss_last"):
        values = [s[key] for s in summaries if key in s]
        if values:
            out[key] = float(max(values))
    out["params"] = float(case.config().params())
    return out


def gang_train(env, case: TrainCase) -> TrainResult:
    """`train_steps` on a LocalGang rank: SP group of the first `sp` ranks (DP = 1)."""
    return train_steps(case, env.rank, env.group(case.sp))


def main() -> None:
    """Every algorithm inside the tiny model at P = 4 on a LocalGang: TGS and model FLOP/s."""
    from seqpar.platform.localgang import LocalGang

    algos = [("ring", ()), ("ulysses", ()), ("allgather", ()), ("usp", (("dhp", 2),)),
             ("double_ring", (("inner_ring", 2),)), ("wallfacer", (("team_size", 2),)), ("burst", ())]
    with LocalGang(4, sizes=(4,), device="cpu") as gang:
        for n in (256, 1024):
            for name, opts in algos:
                case = TrainCase(algorithm=name, sp=4, seq_len=n, options=opts, iters=3)
                s = gang.run(gang_train, case)[0].summary
                print(f"N={n:5} {name:>12}: step {s['step_s'] * 1e3:7.1f} ms  TGS {s['tgs']:8.1f}  "
                      f"model GFLOP/s/device {s['model_flops_per_s_halved'] / 1e9:6.2f} (halved) "
                      f"{s['model_flops_per_s_full'] / 1e9:6.2f} (full)  peak {s['peak_mem_bytes']}  "
                      f"act {s['activation_bytes']}")


if __name__ == "__main__":
    main()
