"""Mode `train`: training steps of the decoder on one rank, a measure like the others.

    m = measure_training(case, rank, None, device, nodes=node_map, links=links)  # MEASURES["train"]
    out = train_steps(case, rank, sp_group)    # the same loop without Ray: losses, ledger, summary

The step (`train_steps.step`): the batch of this step and replica (seeded random tokens, or packed
documents of a text file), a barrier, forward to the loss, backward, AdamW, every timestamp after a
device sync so the clock sees the kernels, not their enqueue. It runs in the loop every mode runs
(`timing.iterate`: warm-up, the timed steps under the memory meter and the noise meter, the first
under the ledger, links classed by the trial's node map) and is recorded as every mode's is
(`record.rank_record`). Besides, each rank records the memory levers: the bytes of model states it
holds (`model.memory.state_bytes`, after the first step), the activation bytes kept for backward
(`model.memory.AllocationMeter` over one more forward, outside the timed steps), the FLOPs its
checkpointing mode recomputes, and the loss of every step. The trial's throughput (tokens/s of the
whole DP x SP job, TGS, model FLOP/s and MFU) is the driver's (`workers.metrics`).
"""

from __future__ import annotations

import functools
import gc
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from seqpar import algorithms
from seqpar.algorithms.base import DTYPES
from seqpar.algorithms.comm import Links
from seqpar.algorithms.mesh import Mesh
from seqpar.case import TrainCase
from seqpar.model import Transformer
from seqpar.model import flops as model_flops
from seqpar.model.memory import AllocationMeter, state_bytes
from seqpar.model.text import CorpusData, TextData
from seqpar.platform.devices import peak_flops
from seqpar.workers.measure.record import RankMeasurement, rank_record
from seqpar.workers.measure.timing import Loop, iterate, sync
from seqpar.workers.measure.varlen import measure_steps
from seqpar.workers.metrics import step_metrics


@dataclass
class TrainResult:
    """One rank's training steps: the loop's measurement, every step's loss (warm-up included, in
    order) and the memory levers."""

    rank: int
    case: TrainCase
    loop: Loop[float]
    losses: list[float]
    levers: dict[str, float] = field(default_factory=dict)
    device_name: str = "cpu"
    expert_load: list[list[int]] = field(default_factory=list)  # MoE layers' per-expert pairs

    @property
    def ledger(self) -> algorithms.Ledger:
        return self.loop.ledger

    @property
    def steps(self) -> list[dict[str, float]]:
        """Each timed step's seconds: forward, backward with the optimizer, and both."""
        return [{"fwd_s": f, "bwd_s": b, "step_s": f + b}
                for f, b in zip(self.loop.fwd_s, self.loop.bwd_s, strict=True)]

    @property
    def summary(self) -> dict[str, Any]:
        """Median step times, this rank's throughput (`workers.metrics.step_metrics`), the peak
        memory over the timed steps and the memory levers: a one-rank view for scripts and tests
        (a trial's numbers are the driver's, over every rank)."""
        med = {k: statistics.median(r[k] for r in self.steps) for k in ("fwd_s", "bwd_s", "step_s")}
        rates = step_metrics(self.case, med["step_s"], peak_flops(self.device_name, self.case.dtype))
        return {**rates, **med, "peak_mem_bytes": self.loop.memory.peak_bytes, **self.levers}


@functools.lru_cache(maxsize=4)
def _text(path: str, separator: str) -> TextData:
    return TextData.load(path, separator)


@functools.lru_cache(maxsize=4)
def _corpus(path: str) -> CorpusData:
    return CorpusData.load(path)


def batch_tokens(case: TrainCase, step: int, replica: int
                 ) -> tuple[torch.Tensor, tuple[int, ...] | None]:
    """The (batch, N + 1) batch of `replica` at `step`, the same on every SP rank, and its packed
    documents' boundaries (None for random tokens, drawn from the seed)."""
    if case.text is not None:
        return _text(case.text, case.text_separator).batch(step * case.dp + replica, case.seq_len)
    if case.corpus is not None:
        return _corpus(case.corpus).batch(step * case.dp + replica, case.seq_len)
    gen = torch.Generator().manual_seed(case.seed * 1_000_003 + step * 1_009 + replica)
    return torch.randint(0, case.config().vocab, (case.batch, case.seq_len + 1), generator=gen), None


def build(case: TrainCase, sp_group: dist.ProcessGroup | None,
          dp_group: dist.ProcessGroup | None = None, mesh: Mesh | None = None,
          device: torch.device | str = "cpu") -> Transformer:
    policy = case.state_policy()
    return Transformer(case.config(), attention=case.algorithm, layout=case.layout, group=sp_group,
                       dp_group=dp_group, checkpoint=case.checkpoint, seq_fraction=case.seq_fraction,
                       fused_head=case.fused_head, head_tiles=case.head_tiles, seed=case.seed,
                       dtype=DTYPES[case.dtype], mesh=mesh, master_dtype=policy.master_dtype,
                       states=policy.states, offload=policy.offload, device=device,
                       tiled=case.tiled, mask=case.attention_mask, mla_pass=case.mla_pass,
                       linear_sp=case.linear_sp, ep=case.ep,
                       **dict(case.options))


def train_steps(case: TrainCase, rank: int, sp_group: dist.ProcessGroup | None,
                dp_group: dist.ProcessGroup | None = None, replica: int = 0,
                device_name: str = "cpu", mesh: Mesh | None = None,
                device: torch.device | str = "cpu", node_of_rank: Sequence[int] | None = None
                ) -> TrainResult:
    """Warm-up, then `iters` timed AdamW steps on this rank (`timing.iterate`). With `mesh` (DP x
    SP) the groups come from it; `node_of_rank` classes the ledger's links."""
    device = torch.device(device)
    net = build(case, sp_group, dp_group, mesh, device)
    opt = net.optimizer(case.lr)
    losses: list[float] = []
    held: list[int] = []

    def step() -> tuple[float, float, float]:
        """One training step: (forward s, backward and optimizer s, loss)."""
        tokens, cu = batch_tokens(case, len(losses), replica)
        tokens = tokens.to(device, non_blocking=True)
        if net.group is not None:
            dist.barrier(group=net.group)
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
        return t1 - t0, t2 - t1, losses[-1]

    loop = iterate(step, case.warmup, case.iters, device, nodes=node_of_rank)
    gc.collect()  # activation bytes: one more forward, outside the timed steps (the meter is slow)
    tokens, cu = batch_tokens(case, 0, replica)
    with AllocationMeter(device) as mem:
        loss = net.loss(tokens.to(device), cu)
    del loss
    net.zero_grad(set_to_none=True)
    cfg = case.config()
    levers = {"activation_bytes": mem.retained, "state_bytes": held[0],
              "recomputed_flops": model_flops.recomputed_flops(
                  cfg, case.batch, case.seq_len, case.sp, case.checkpoint, case.seq_fraction),
              "params": cfg.params(), "loss_last": losses[-1]}
    return TrainResult(rank, case, loop, losses, levers, device_name, net.router_log.loads())


def dp_sp_mesh(case: TrainCase, nodes: Sequence[int] | None = None,
               links: Links | None = None) -> Mesh:
    """The trial's DP x SP mesh: the attention's rank grid per replica, replica d on ranks
    [d*sp, (d+1)*sp), built on every rank of the world (algorithms.mesh_for)."""
    return algorithms.mesh_for(case.algorithm, case.sp, dp=case.dp, nodes=nodes, links=links,
                               **dict(case.options))


def measure_training(case: TrainCase, rank: int, group: dist.ProcessGroup | None = None,
                     device: torch.device | str = "cpu", *, nodes: Sequence[int] | None = None,
                     links: Links | None = None, mesh: Mesh | None = None) -> RankMeasurement:
    """`train_steps` on a rank of an initialised world of sp x dp ranks: the mode `train` of
    `measure.MEASURES`. Training builds its own DP x SP mesh on the whole world (`group` and
    `mesh` are the attention modes'); `nodes`: each rank's node (link classes, burst's and usp's
    node-aware rings); `links`: the link classes to emulate."""
    device = torch.device(device)
    if case.lengths:  # a step of variable-length sequences, dealt to the pool's groups
        return measure_steps(case, rank, device, nodes=nodes, links=links)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    mesh = dp_sp_mesh(case, nodes, links)
    replica = mesh.coord("dp") if "dp" in mesh.comms else 0
    out = train_steps(case, rank, None, None, replica, name, mesh=mesh, device=device,
                      node_of_rank=nodes)
    return rank_record(case, rank, device, out.loop,
                       extra={"train": out.levers, "losses": out.losses,
                              "expert_load": out.expert_load})


def gang_train(env: Any, case: TrainCase) -> TrainResult:
    """`train_steps` on a LocalGang rank: SP group of the first `sp` ranks (DP = 1)."""
    return train_steps(case, env.rank, env.group(case.sp))
