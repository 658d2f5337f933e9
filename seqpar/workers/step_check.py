"""A step of variable-length sequences against the one-process model, in float64: what `seqpar
check --lengths` and the multi-rank tests run.

    case = experiments.steps.make_case("ring", 4, "lognormal:...", tokens=96, capacity=8, ...)
    results = check_steps([case], world=4, device=None, say=print)   # StepCheck per case

`rank_run` runs on every rank of a local gang (the pool is its first `case.world` ranks; every rank
takes part in creating the pool's groups): for each batch of the case it runs this rank's share
(`model.step.train_step`, the runner's own code) from the same initial parameters and returns the
loss and every full gradient. `reference` trains the one-process model on the same sequences, one
at a time (each its own forward: no packing at all), loss summed per token over the batch.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from seqpar.algorithms.mesh import build_pool
from seqpar.case import TrainCase
from seqpar.model import Transformer
from seqpar.model.memory import state_bytes
from seqpar.model.states import full
from seqpar.model.step import StepModel, pack_of, train_step
from seqpar.platform import localgang
from seqpar.workers.measure.varlen import build, pool_groups, run_batches, tokens_of

LOSS_TOLERANCE, GRAD_TOLERANCE = 1e-10, 1e-8  # float64: the model's exactness tests' bounds
Say = Callable[[str], None]


@dataclass
class StepCheck:
    case: TrainCase
    loss_error: float
    grad_error: float
    degrees: dict[int, int]
    counts: tuple[int, ...]
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


def rank_run(env: Any, case: TrainCase) -> list[tuple[float, dict[str, torch.Tensor]]] | None:
    """Every batch's (loss, full gradients) on this gang rank (None outside the pool)."""
    return on_pool(env, case, _losses_and_grads)


def rank_timeline(env: Any, case: TrainCase) -> list[tuple[tuple[int, ...], float, float]] | None:
    """Every micro-batch of the first batch this gang rank ran: (group, wall-clock start, end)."""
    return on_pool(env, case, _timeline)


def rank_trained(env: Any, case: TrainCase) -> tuple[dict[str, torch.Tensor], int] | None:
    """This gang rank's full parameters after an optimizer step on each batch of the case (the
    runner's own `run_batches` and the model's optimizer), and the state bytes it held."""
    return on_pool(env, case, _trained)


def _trained(model: StepModel, case: TrainCase, rank: int, device: torch.device):
    opt = model.net.optimizer(case.lr)
    run_batches(model, case, rank, opt, device)
    held = state_bytes(model.net, opt)
    return {k: full(p).detach().cpu().clone() for k, p in model.net.named_parameters()}, held


def _losses_and_grads(model: StepModel, case: TrainCase, rank: int, device: torch.device):
    out = []
    for i, batch in enumerate(case.batches):
        res = train_step(model, batch.deal,
                         lambda j, i=i, b=batch: tokens_of(case, i, b.sequences[j]), rank, device)
        out.append((res.loss, {k: v.detach().cpu() for k, v in model.net.full_grads().items()}))
        model.net.zero_grad(set_to_none=True)
    return out


def _timeline(model: StepModel, case: TrainCase, rank: int, device: torch.device):
    batch = case.batches[0]
    res = train_step(model, batch.deal, lambda j: tokens_of(case, 0, batch.sequences[j]), rank,
                     device)
    return [(r.group, res.clock0 + r.start_s, res.clock0 + r.end_s) for r in res.micro]


def on_pool(env: Any, case: TrainCase, fn: Callable[..., Any]) -> Any:
    """fn(model, case, pool rank, device) on the pool of the gang's first case.world ranks: every
    gang rank takes part in creating (and destroying) the pool's groups."""
    device = torch.device(env.device)
    pool = build_pool(pool_groups(case), members=range(case.world),
                      whole=_whole(case.world, env.world))
    out = None
    if pool is not None:
        model = build(case, pool, device)
        out = fn(model, case, pool.pos, device)
        del model
    gc.collect()
    dist.barrier()  # every rank done with the pool's groups before any is destroyed
    if pool is not None:
        for group in pool.groups():
            if group is not _WHOLE.get(case.world):
                dist.destroy_process_group(group)
    return out


# a pool's own group, kept for the gang's life: FSDP2's meshes over a destroyed group and a new one
# of the same ranks do not resolve (torch 2.13: "Could not resolve the process group registered under
# the name 1" in the next trial's initialisation); the groups inside the pool are destroyed
_WHOLE: dict[int, Any] = {}


def _whole(size: int, world: int) -> Any:
    if size == world or size == 1:
        return None
    if size not in _WHOLE:
        _WHOLE[size] = dist.new_group(list(range(size)))  # every rank of the gang, one order
    return _WHOLE[size]


def reference(case: TrainCase) -> list[tuple[float, dict[str, torch.Tensor]]]:
    """Every batch's (loss, gradients) of the one-process model, one sequence at a time."""
    net = Transformer(case.config(), attention="local", checkpoint="none", seed=case.seed,
                      dtype=torch.float64, fused_head=case.fused_head, head_tiles=case.head_tiles,
                      **({"window": case.window} if case.window else {}))
    out = []
    for i, batch in enumerate(case.batches):
        total = sum(s.length for s in batch.sequences)
        loss = sum(net(pack=pack_of([tokens_of(case, i, s)])) for s in batch.sequences) / total
        loss.backward()
        out.append((loss.item(), {k: p.grad.clone() for k, p in net.named_parameters()
                                  if p.grad is not None}))
        net.zero_grad(set_to_none=True)
    return out


def compare(case: TrainCase, per_rank: Sequence[Any], want: Sequence[Any]) -> StepCheck:
    """Every pool rank's every batch against the reference: loss error (absolute) and the largest
    gradient error relative to its gradient's largest entry."""
    loss_err = grad_err = 0.0
    failures: list[str] = []
    for rank, got in enumerate(r for r in per_rank if r is not None):
        for b, ((loss, grads), (ref_loss, ref_grads)) in enumerate(zip(got, want, strict=True)):
            loss_err = max(loss_err, abs(loss - ref_loss))
            missing = set(ref_grads) - set(grads)
            if missing:
                failures.append(f"rank {rank} batch {b}: no gradient for {sorted(missing)[:3]}")
            for name, g in grads.items():
                ref = ref_grads.get(name)
                if ref is None:  # no gradient in one process (a score bias): zero here too
                    if g.abs().max().item() > 0:
                        failures.append(f"rank {rank} batch {b}: a gradient for {name}")
                    continue
                grad_err = max(grad_err, ((g - ref).abs().max() / ref.abs().max()).item())
    if loss_err > LOSS_TOLERANCE:
        failures.append(f"loss error {loss_err:.1e} > {LOSS_TOLERANCE:g}")
    if grad_err > GRAD_TOLERANCE:
        failures.append(f"gradient error {grad_err:.1e} > {GRAD_TOLERANCE:g}")
    first = case.batches[0].deal
    return StepCheck(case, loss_err, grad_err, first.degrees, first.counts, failures)


def check_steps(cases: Sequence[TrainCase], world: int, device: str | None,
                say: Say = lambda line: None) -> list[StepCheck]:
    """Every case on a local gang of `world` ranks, held against the one-process model."""
    say(f"starting {world} local ranks ...")
    with localgang.LocalGang(world, device=device) as gang:
        say(f"ranks ready on {gang.device}; running {len(cases)} steps")
        return [compare(c, gang.run(rank_run, c), reference(c)) for c in cases]
