"""Training steps of the model on one rank: AdamW on seeded synthetic token batches, warm-up, timed
steps, and the metrics the papers report, per step and per rank.

    case = TrainCase(algorithm="ring", sp=4, seq_len=1024)
    out = train_steps(case, rank, sp_group, dp_group=None)      # on every rank of the gang
    out.steps[i]["step_s"], out.summary["tgs"], out.summary["mfu_halved"], ...

Metrics: step time, tokens/s (whole DP x SP job), TGS (tokens per device per second), model FLOP/s
per device and MFU under both FLOP conventions (`model.flops`, tagged `halved` / `full`; MFU only
where the device's peak is known), peak memory over one untimed step (`bench.MemoryMeter`),
activation bytes kept for backward (`model.memory.AllocationMeter` over one forward), FLOPs the
checkpointing mode recomputes, and attention bytes by (op, link, phase) from the ledger.
`gang_train` runs it on a LocalGang rank (tests, `python -m seqpar.workers.train`).
"""

from __future__ import annotations

import dataclasses
import gc
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from seqpar import algorithms
from seqpar.algorithms.base import DTYPES
from seqpar.model import ModelConfig, Transformer
from seqpar.model import flops as model_flops
from seqpar.model.memory import AllocationMeter
from seqpar.workers.bench import MemoryMeter
from seqpar.workers.result import peak_flops


@dataclass(frozen=True)
class TrainCase:
    algorithm: str = "ring"
    sp: int = 1                      # sequence-parallel ranks
    dp: int = 1                      # data-parallel replicas (each its own batch)
    layout: str = "zigzag"
    model: str = "tiny"              # a model.PRESETS name
    model_overrides: tuple[tuple[str, int], ...] = ()   # e.g. (("vocab", 4096),)
    seq_len: int = 256
    batch: int = 1                   # per DP replica
    dtype: str = "float32"
    checkpoint: str = "none"
    seq_fraction: float = 0.5
    fused_head: bool = False
    head_tiles: tuple[int, int] = (1024, 8192)
    options: tuple[tuple[str, object], ...] = ()
    warmup: int = 1
    iters: int = 3
    seed: int = 0
    lr: float = 1e-3

    def config(self) -> ModelConfig:
        return dataclasses.replace(ModelConfig.preset(self.model), **dict(self.model_overrides))


@dataclass
class TrainResult:
    rank: int
    steps: list[dict[str, float]]
    summary: dict[str, Any]
    losses: list[float]
    ledger: dict[str, int] = field(default_factory=dict)


def batch_tokens(case: TrainCase, step: int, replica: int) -> torch.Tensor:
    """The (batch, N + 1) batch of `replica` at `step`: the same on every SP rank, from the seed."""
    gen = torch.Generator().manual_seed(case.seed * 1_000_003 + step * 1_009 + replica)
    return torch.randint(0, case.config().vocab, (case.batch, case.seq_len + 1), generator=gen)


def build(case: TrainCase, sp_group: dist.ProcessGroup | None,
          dp_group: dist.ProcessGroup | None = None) -> Transformer:
    return Transformer(case.config(), attention=case.algorithm, layout=case.layout, group=sp_group,
                       dp_group=dp_group, checkpoint=case.checkpoint, seq_fraction=case.seq_fraction,
                       fused_head=case.fused_head, head_tiles=case.head_tiles, seed=case.seed,
                       dtype=DTYPES[case.dtype], **dict(case.options))


def train_steps(case: TrainCase, rank: int, sp_group: dist.ProcessGroup | None,
                dp_group: dist.ProcessGroup | None = None, replica: int = 0,
                device_name: str = "cpu") -> TrainResult:
    """Warm-up, then `iters` timed AdamW steps on this rank; metrics per step and a summary."""
    cfg = case.config()
    net = build(case, sp_group, dp_group)
    opt = torch.optim.AdamW(net.parameters(), lr=case.lr)
    losses: list[float] = []

    def step(i: int) -> float:
        tokens = batch_tokens(case, i, replica)
        if sp_group is not None:
            dist.barrier(group=sp_group)
        t0 = time.perf_counter()
        loss = net.loss(tokens)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        return time.perf_counter() - t0

    meter = MemoryMeter(torch.device("cpu"))
    for i in range(max(case.warmup - 1, 0)):
        step(i)
    meter.start()
    step(max(case.warmup - 1, 0))
    peak = meter.stop()
    world = case.sp * case.dp
    tokens = case.batch * case.seq_len * case.dp
    peak_device = peak_flops(device_name, case.dtype)
    steps = []
    ledger_totals: dict[str, int] = {}
    for i in range(case.iters):
        if i == 0:
            with algorithms.recording() as ledger:
                dt = step(case.warmup + i)
            for e in ledger.entries.values():
                key = f"{e.phase}_{e.op}_{e.link}"
                ledger_totals[key] = ledger_totals.get(key, 0) + e.bytes_sent
        else:
            dt = step(case.warmup + i)
        row = {"step_s": dt, "tokens_per_s": tokens / dt, "tgs": tokens / dt / world}
        for conv in model_flops.CONVENTIONS:
            per_device = model_flops.step_flops(cfg, case.batch * case.dp, case.seq_len, conv) / world
            row[f"model_flops_per_s_{conv}"] = per_device / dt
            if peak_device is not None:
                row[f"mfu_{conv}"] = per_device / dt / peak_device
        steps.append(row)
    # activation bytes: one more forward, outside the timed steps (the profiler slows it)
    gc.collect()
    with AllocationMeter() as mem:
        loss = net.loss(batch_tokens(case, 0, replica))
    del loss
    net.zero_grad(set_to_none=True)
    summary: dict[str, Any] = {k: sorted(r[k] for r in steps)[len(steps) // 2] for k in steps[0]}
    summary.update(peak_mem_bytes=peak, activation_bytes=mem.retained,
                   recomputed_flops=model_flops.recomputed_flops(
                       cfg, case.batch, case.seq_len, case.sp, case.checkpoint, case.seq_fraction),
                   params=cfg.params())
    return TrainResult(rank, steps, summary, losses, ledger_totals)


def gang_train(env, case: TrainCase) -> TrainResult:
    """`train_steps` on a LocalGang rank: SP group of the first `sp` ranks (DP = 1)."""
    return train_steps(case, env.rank, env.group(case.sp) if case.sp > 1 else None)


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
