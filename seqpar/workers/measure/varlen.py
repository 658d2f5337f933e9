"""Mode `train` with `lengths`: optimizer steps over batches of variable-length sequences, dealt to
the pool's sequence-parallel groups by the trial's policy (the deals are made on the driver and
carried in the TrainCase; `model.step` runs one).

    m = measure_steps(case, rank, device, nodes=node_map, links=links)   # measure_training calls it

The groups are created once (`algorithms.mesh.build_pool`, every rank, one order), the model
(replicated, or FSDP2 over the pool) and its attention for each group once; then the loop every
mode runs (`timing.iterate`): a pass replays every batch of `case.batches` once, an optimizer step
each, so every batch is timed as often as the others and the interval measures the machine, not
the data. The record carries each batch's step times, a timeline of the last timed pass's first
batch (which sequences ran on which group, when), the bytes by group size and the options each
group size ran with.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch

from seqpar import algorithms
from seqpar.algorithms.base import DTYPES
from seqpar.algorithms.comm import Links
from seqpar.algorithms.mesh import Pool, build_pool, solo_mesh
from seqpar.case import TrainCase
from seqpar.model import Transformer
from seqpar.model.memory import state_bytes
from seqpar.model.step import StepModel, StepResult, seeded_tokens, train_step
from seqpar.model.text import CorpusData, TextData
from seqpar.rules.lengths import Sequence as Seq
from seqpar.workers.measure.record import RankMeasurement, rank_record
from seqpar.workers.measure.timing import iterate


def pool_groups(case: TrainCase, nodes: Sequence[int] | None = None) -> list[tuple]:
    """(pool ranks, grid, axes) of every group of more than one rank the trial's deals use, in one
    order (by size, then first rank): what `build_pool` creates."""
    used = sorted({m.group for b in case.batches for m in b.deal.micro if m.size > 1},
                  key=lambda g: (len(g), g))
    out = []
    for ranks in used:
        name, opts = case.options_at(len(ranks))
        node_ids = None if nodes is None else [nodes[r] for r in ranks]
        grid = algorithms.grid_for(name, len(ranks), node_ids, **opts)
        out.append((ranks, grid, tuple(algorithms.get(name).axes)))
    return out


def build(case: TrainCase, pool: Pool | None, device: torch.device) -> StepModel:
    """The model (attention per group of the pool) a rank trains."""
    policy = case.state_policy()
    net = Transformer(case.config(), attention="local", layout=case.layout, mesh=solo_mesh(),
                      checkpoint=case.checkpoint, seq_fraction=case.seq_fraction,
                      fused_head=case.fused_head, head_tiles=case.head_tiles, seed=case.seed,
                      dtype=DTYPES[case.dtype], master_dtype=policy.master_dtype,
                      states=policy.states, offload=policy.offload, device=device,
                      tiled=case.tiled, shard_group=None if pool is None else pool.whole,
                      ep=case.ep)
    linear = {"linear_sp": case.linear_sp} if case.linear_sp else {}
    options = {size: (name, {**opts, **linear})
               for size, (name, opts) in ((s, case.options_at(s)) for s in case.group_sizes())}
    return StepModel.build(net, pool, options, case.layout, case.window)


@functools.lru_cache(maxsize=4)
def _text(path: str) -> TextData:
    return TextData.load(path)


@functools.lru_cache(maxsize=4)
def _corpus(path: str) -> CorpusData:
    return CorpusData.load(path)


def tokens_of(case: TrainCase, batch: int, seq: Seq) -> torch.Tensor:
    """The L + 1 tokens of one sequence: random (seeded by the trial, the batch and the draw) or,
    for `text:` lengths, its document's bytes and the byte after it (a corpus's: its ids)."""
    if case.corpus is not None or case.lengths.startswith("text:"):
        data = (_corpus(case.corpus) if case.corpus is not None else
                _text(case.lengths.removeprefix("text:")))
        return data.tokens_at(data.starts[seq.source], seq.length + 1)
    return seeded_tokens(case.seed, batch, seq, case.config().vocab)


def run_batches(model: StepModel, case: TrainCase, rank: int, opt: torch.optim.Optimizer,
                device: torch.device) -> list[tuple[float, StepResult]]:
    """One pass: every batch once, an optimizer step each: (step seconds, its result) per batch."""
    out = []
    for i, batch in enumerate(case.batches):
        t0 = time.perf_counter()
        res = train_step(model, batch.deal, lambda j, i=i, b=batch: tokens_of(case, i, b.sequences[j]),
                         rank, device)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        out.append((time.perf_counter() - t0, res))
    return out


def measure_steps(case: TrainCase, rank: int, device: torch.device, *,
                  nodes: Sequence[int] | None = None, links: Links | None = None
                  ) -> RankMeasurement:
    """This rank's record of a training trial with lengths (see the module docstring)."""
    pool = build_pool(pool_groups(case, nodes), nodes=nodes, links=links)
    model = build(case, pool, device)
    opt = model.net.optimizer(case.lr)
    passes: list[list[tuple[float, StepResult]]] = []
    held: list[int] = []

    def one_pass() -> tuple[float, float, list[tuple[float, StepResult]]]:
        done = run_batches(model, case, rank, opt, device)
        if not held:
            held.append(state_bytes(model.net, opt))
        passes.append(done)
        n = len(done)
        fwd = sum(r.forward_s - r.start_s for _, res in done for r in res.micro)
        return fwd / n, (sum(s for s, _ in done) - fwd) / n, done

    loop = iterate(one_pass, case.warmup, case.iters, device, nodes=nodes)
    timed = passes[-case.iters:]
    losses = [res.loss for p in passes for _, res in p]
    extra = {"train": {"state_bytes": held[0], "params": case.config().params(),
                       "loss_last": losses[-1]},
             "losses": losses, "varlen": _summary(case, timed, loop.ledger.to_dict()),
             "expert_load": model.net.router_log.loads()}
    return per_step(rank_record(case, rank, device, loop, extra=extra), len(case.batches))


def per_step(m: RankMeasurement, batches: int) -> RankMeasurement:
    """The record with its ledger's bytes and FLOPs (one pass: every batch once) as a step's
    average, so that every number of the trial is a step's."""
    ledger = dict(m.ledger)
    ledger["entries"] = [{**e, "bytes_sent": e["bytes_sent"] / batches}
                         for e in ledger.get("entries", [])]
    ledger["skipped"] = [{**e, "bytes_sent": e["bytes_sent"] / batches}
                         for e in ledger.get("skipped", [])]
    ledger["flops"] = {k: v / batches for k, v in ledger.get("flops", {}).items()}
    return dataclasses.replace(
        m, ledger=ledger, flops={k: v / batches for k, v in m.flops.items()},
        bytes_sent={k: v / batches for k, v in m.bytes_sent.items()})


def _summary(case: TrainCase, timed: list[list[tuple[float, StepResult]]],
             ledger: dict[str, Any]) -> dict[str, Any]:
    """What the driver needs of this rank's dynamic steps (workers.varlen_metrics)."""
    per_batch = [[p[i][0] * 1e3 for p in timed] for i in range(len(case.batches))]
    busy = [statistics.median(p[i][1].busy_s for p in timed) * 1e3
            for i in range(len(case.batches))]
    span = [statistics.median(max((r.end_s for r in p[i][1].micro), default=0.0) for p in timed)
            * 1e3 for i in range(len(case.batches))]
    first = timed[-1][0][1]
    by_size: dict[str, int] = {}
    for p in timed[:1]:
        for _, res in p:
            for r in res.micro:
                key = str(len(r.group) or 1)
                by_size[key] = by_size.get(key, 0) + r.bytes_sent
    return {"batch_ms": per_batch, "busy_ms": busy, "span_ms": span,
            "timeline": [[list(r.seqs), list(r.group), r.tokens, r.start_s, r.forward_s, r.end_s]
                         for r in first.micro],
            "bytes_by_size": by_size,
            "options": {str(s): list(case.options_at(s)) for s in case.group_sizes()},
            "ledger_total": sum(e["bytes_sent"] for e in ledger.get("entries", []))}
