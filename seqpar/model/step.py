"""One optimizer step over a batch of whole sequences, dealt to sequence-parallel groups of a pool
(`rules.deal`: static packs or the dynamic deal), exact whatever the deal.

    pool = build_pool(groups)                        # algorithms.mesh: once per trial, every rank
    model = StepModel.build(net, pool, {size: (algorithm, options)}, layout)  # attention per group
    out = train_step(model, deal, tokens_of, pool_rank)  # this rank's micro-batches, then the
    opt.step()                                           # gradients summed over the pool

Each rank runs its micro-batches (`Deal.of_rank`) in the deal's one global order: a micro-batch is
a pack of whole sequences on one group, each sequence a document of the pack (attention stays
inside it; RoPE restarts at its first token). The loss is summed per token over the whole batch
and divided by the batch's tokens (token-level normalisation: the result does not depend on the
deal), so every rank's gradient is its share of the one gradient; the shares are summed over the
pool once, after the last micro-batch — an all-reduce of every gradient (replicated states), or
FSDP2's reduce-scatter of each micro-batch's (states sharded over the pool, where every rank runs
the same number of micro-batches: a rank with nothing in a round runs an empty one, weight 0).
Under expert parallelism every rank runs every round too (each MoE layer's all-to-alls join the
EP group's ranks), and the experts' gradients are summed over their EDP group, not the pool.

Under dist-opt (Megatron's distributed optimizer on FSDP2) the pool's collectives sit outside the
micro-batches, where no group's attention can interleave with them: every rank gathers every
unit's parameters before its first micro-batch (one all-gather a unit, in one order), its
backwards accumulate whole gradients with no reduction, and after its last micro-batch one closing
pass (a token on the rank alone, weight 0: its gradients are zeros) reduce-scatters them. A rank
with no micro-batch joins both with zeros, so no rank needs as many micro-batches as another.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from seqpar.algorithms import ledger
from seqpar.algorithms.mesh import Pool, solo_mesh
from seqpar.errors import require
from seqpar.model import ep, states
from seqpar.model.transformer import Pack, SPGroup, Transformer, build_layers
from seqpar.rules.deal import Deal, MicroBatch
from seqpar.rules.layouts import positions as layout_positions
from seqpar.rules.lengths import Sequence, boundaries
from seqpar.rules.pool import LOCAL


@dataclass
class StepModel:
    """The model and the attention of every group of the pool this rank is in."""

    net: Transformer
    pool: Pool | None
    groups: dict[tuple[int, ...], SPGroup] = field(default_factory=dict)

    @classmethod
    def build(cls, net: Transformer, pool: Pool | None,
              options: Mapping[int, tuple[str, dict[str, Any]]], layout: str,
              window: int | None = None) -> StepModel:
        """`options`: group size -> (algorithm, options) it runs (`rules.pool.options_at`);
        `window`: every full layer's (the model's sliding layers keep their own). Each group
        gets an attention per layer kind on its one mesh (`transformer.build_layers`)."""
        cfg, groups = net.cfg, {}
        require(not cfg.aux_loss_coef, "model.aux_loss_coef", cfg.aux_loss_coef,
                "must be 0 in a step of lengths (its load-balancing loss would depend on how the "
                "sequences are packed): train fixed lengths, or set output_router_logits false")
        for ranks, mesh in ({} if pool is None else pool.meshes).items():
            name, opts = options[len(ranks)]
            layers = build_layers(name, cfg, window=window, layout=layout, mesh=mesh, **opts)
            groups[ranks] = SPGroup(layers[0], ranks.index(pool.pos), len(ranks), layers)
        solo_opts = options[1][1] if 1 in options else {}
        layers = build_layers(LOCAL, cfg, window=window, layout="contiguous", mesh=solo_mesh(),
                              **solo_opts)
        groups[()] = SPGroup(layers[0], 0, 1, layers)
        return cls(net, pool, groups)

    def group(self, m: MicroBatch) -> SPGroup:
        return self.groups[()] if m.size == 1 else self.groups[m.group]

    @property
    def sharded(self) -> bool:
        """FSDP's per-forward gathers over the pool: every rank runs every round."""
        return self.net.policy.states == "fsdp"

    @property
    def gathered(self) -> bool:
        """dist-opt over a pool: gathered once a step, reduce-scattered once."""
        return (self.net.policy.states == "dist-opt" and self.pool is not None
                and self.pool.whole is not None)


@dataclass(frozen=True)
class MicroRecord:
    """When one micro-batch ran on this rank, seconds from the step's start (after a barrier)."""

    seqs: tuple[int, ...]
    group: tuple[int, ...]
    tokens: int
    start_s: float
    forward_s: float      # when its forward ended
    end_s: float
    bytes_sent: int       # what this rank sent for it (while a ledger records)


@dataclass
class StepResult:
    loss: float                  # the batch's mean loss (the same on every rank of the pool)
    seconds: float               # this rank's step, barrier to the reduced gradients
    busy_s: float                # its micro-batches' forward + backward
    micro: list[MicroRecord]
    clock0: float = 0.0          # time.perf_counter() at the step's start (one host: one clock)


def pack_of(sequences: list[torch.Tensor], layout: str = "contiguous", world: int = 1) -> Pack:
    """Whole sequences, each given as its L + 1 tokens, laid end to end as one pack for a group
    of `world` ranks in `layout`. A pack too short for every rank of the group to hold a token
    gets a padding document after them (its own document: no real token sees it; the loss
    leaves it out)."""
    n = sum(len(t) - 1 for t in sequences)
    pad = padding(n, boundaries([len(t) - 1 for t in sequences]), layout, world)
    if pad:
        sequences = [*sequences, torch.zeros(pad + 1, dtype=torch.long)]
    cu = boundaries([len(t) - 1 for t in sequences])
    inputs = torch.cat([t[:-1] for t in sequences])[None, :]
    labels = torch.cat([t[1:] for t in sequences])[None, :]
    rope = torch.cat([torch.arange(len(t) - 1) for t in sequences])
    return Pack(inputs, labels, rope, cu, n if pad else None)


def padding(n: int, cu: tuple[int, ...], layout: str, world: int) -> int:
    """Tokens of padding a pack of n tokens needs so that every rank of `world` holds at least
    one in `layout` (and the pack at least two a rank): 0 for any pack a deal of capacity >= 2
    makes, except the last, cut sequences' packs."""
    if world == 1:
        return 0
    pad = max(0, 2 * world - n)
    while not all(layout_positions(layout, r, world, n + pad, (*cu, n + pad) if pad else cu)
                  for r in range(world)):
        pad += 1
    return pad


EMPTY = pack_of([torch.zeros(2, dtype=torch.long)])  # an empty round's stand-in (weight 0)


def seeded_tokens(seed: int, batch: int, seq: Sequence, vocab: int) -> torch.Tensor:
    """The L + 1 random tokens of one sequence of batch `batch`, the same on every rank."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + batch * 1_009 + seq.source * 7_919 + 1)
    return torch.randint(0, vocab, (seq.length + 1,), generator=gen)


def train_step(model: StepModel, deal: Deal, tokens_of: Callable[[int], torch.Tensor],
               rank: int, device: torch.device | str = "cpu") -> StepResult:
    """Forward and backward of pool rank `rank`'s micro-batches, then the gradients summed over
    the pool (see the module docstring). `tokens_of(i)`: the L + 1 tokens of sequence i."""
    net, pool = model.net, model.pool
    total = sum(deal.lengths)
    if pool is not None and pool.whole is not None:
        dist.barrier(group=pool.whole)
    t0 = time.perf_counter()
    loss_sum = torch.zeros((), dtype=torch.float64)
    records, busy = [], 0.0
    if model.gathered:
        states.gather(net)
        states.accumulate(net, True)
    if net.experts is not None:  # every MoE layer an all-to-all over the EP group: in step
        require(len({len(deal.of_rank(r)) for r in range(deal.pool)}) == 1, "ep",
                net.experts.ep, "needs every rank of the pool to run as many micro-batches "
                "(the static policy, or equal_counts)")
    for m in deal.of_rank(rank):
        if not m.seqs and not model.sharded and net.experts is None:
            continue  # an empty round matters only to FSDP's gathers and EP's all-to-alls
        sp = model.group(m)
        pack = pack_of([tokens_of(i) for i in m.seqs], net.layout, sp.world) if m.seqs else EMPTY
        sent = _sent()
        start = time.perf_counter()
        local = net(pack=_to(pack, device), sp=sp)
        _sync(device)
        mid = time.perf_counter()
        (local * (1.0 / total if m.seqs else 0.0)).backward()
        _sync(device)
        end = time.perf_counter()
        if m.seqs:
            loss_sum += local.detach().double().cpu()
        busy += end - start
        tokens = (pack.real or int(pack.inputs.shape[1])) if m.seqs else 0
        records.append(MicroRecord(m.seqs, m.group, tokens, start - t0, mid - t0, end - t0,
                                   _sent() - sent))
    if model.gathered:
        states.accumulate(net, False)
        (net(pack=_to(EMPTY, device), sp=model.groups[()]) * 0.0).backward()  # the reduce-scatter
    reduce_grads(net, pool)
    if pool is not None and pool.whole is not None:
        dist.all_reduce(loss_sum, group=pool.whole)
    return StepResult(loss_sum.item() / total, time.perf_counter() - t0, busy, records, t0)


def _sent() -> int:
    """Bytes the innermost recording ledger holds (0 when none records)."""
    ledgers = ledger.active()
    return ledgers[-1].total() if ledgers else 0


def _sync(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _to(pack: Pack, device: torch.device | str) -> Pack:
    if torch.device(device).type == "cpu":
        return pack
    return Pack(pack.inputs.to(device), pack.labels.to(device), pack.rope.to(device), pack.cu)


@torch.no_grad()
def reduce_grads(net: Transformer, pool: Pool | None) -> None:
    """Every replicated gradient summed over the pool (a rank that ran nothing adds zeros); under
    FSDP each backward reduce-scattered its own already, under dist-opt the closing pass."""
    if pool is None or pool.whole is None or net.policy.sharded:
        return
    params = list(net.parameters())
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    experts = set(ep.expert_params(net)) if net.experts is not None else set()
    edp = net.experts.groups.edp if experts else None
    works = [dist.all_reduce(p.grad, group=pool.whole, async_op=True) for p in params
             if p not in experts]
    # under EP the experts' gradients are summed over the ranks holding the same experts
    works += [dist.all_reduce(p.grad, group=edp, async_op=True) for p in params
              if p in experts and edp is not None]
    for w in works:
        w.wait()
