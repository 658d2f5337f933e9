"""What the expert-parallel exactness tests run on the shared gang: a tiny Mixtral- or
Qwen3-MoE-shaped model trained one step with EP over a DP x SP mesh, against the one-process
model in float64 (the loss, every gradient gathered back to its full tensor, and the ledger's
all-to-all bytes against the count from the routing)."""

from __future__ import annotations

import gc
import json
from dataclasses import dataclass

import torch
import torch.distributed as dist

from seqpar import algorithms
from seqpar.algorithms import ledger
from seqpar.algorithms.mesh import build_expert_groups, build_pool
from seqpar.model import Transformer, moe
from seqpar.model.step import StepModel, pack_of, train_step
from seqpar.rules.deal import CostModel, deal
from seqpar.rules.groups import ep_rows
from seqpar.rules.layouts import positions
from seqpar.rules.model import ModelConfig, from_hf
from seqpar.workers import step_check

_COMMON = {"vocab_size": 61, "hidden_size": 48, "num_hidden_layers": 2, "intermediate_size": 32,
           "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 6,
           "rms_norm_eps": 1e-6, "tie_word_embeddings": False}
FAMILIES = {
    "mixtral": {**_COMMON, "model_type": "mixtral", "num_local_experts": 8,
                "num_experts_per_tok": 2},
    "qwen3-moe": {**_COMMON, "model_type": "qwen3_moe", "num_hidden_layers": 3, "num_experts": 8,
                  "num_experts_per_tok": 3, "moe_intermediate_size": 16, "mlp_only_layers": [0],
                  "norm_topk_prob": True},
}


def family(name: str) -> ModelConfig:
    return from_hf(json.loads(json.dumps(FAMILIES[name])), f"{name} config.json")


@dataclass(frozen=True)
class EPCase:
    """One EP step: `ep` over a DP x SP world of sp x dp ranks (dp = world / sp)."""

    family: str
    ep: int
    sp: int
    dp: int
    algorithm: str = "ring"
    states: str = "replicated"
    layout: str = "zigzag"
    lengths: bool = False     # a step of variable-length sequences instead
    policy: str = "static"    # its SP policy (dynamic: with equal counts, as EP needs)
    checkpoint: str = "none"
    seq_len: int = 16
    seed: int = 0

    @property
    def world(self) -> int:
        return self.sp * self.dp

    def label(self) -> str:
        kind = f"lengths/{self.policy}" if self.lengths else "fixed"
        return (f"{self.family} EP={self.ep} SP={self.sp} DP={self.dp} {self.algorithm} "
                f"{self.states} {kind} ckpt={self.checkpoint}")

    def mesh_key(self) -> tuple:
        """The DP x SP mesh the gang builds (None for a step of lengths: its pool's own)."""
        cls = algorithms.get(self.algorithm)
        grid = algorithms.grid_for(self.algorithm, self.sp)
        if self.dp > 1:
            return grid.with_dp(self.dp), (*cls.axes, "dp"), None
        return grid, tuple(cls.axes), None

    def tokens(self) -> torch.Tensor:
        """(dp, N + 1): replica d's batch is row d."""
        gen = torch.Generator().manual_seed(self.seed)
        return torch.randint(0, family(self.family).vocab, (self.dp, self.seq_len + 1),
                             generator=gen)

    def lengths_of(self) -> list[torch.Tensor]:
        gen = torch.Generator().manual_seed(self.seed + 1)
        sizes = torch.randint(3, 2 * self.seq_len, (2 * self.world,), generator=gen).tolist()
        return [torch.randint(0, family(self.family).vocab, (n + 1,), generator=gen)
                for n in sizes]

    def the_deal(self):
        seqs = self.lengths_of()
        if self.policy == "dynamic":
            return deal([len(t) - 1 for t in seqs], self.world, 2 * self.seq_len, "dynamic",
                        CostModel(), equal_counts=True)
        return deal([len(t) - 1 for t in seqs], self.world, 2 * self.seq_len, "static",
                    CostModel(), degree=self.sp)


_KEPT: dict[tuple[int, ...], object] = {}  # the EP tests' groups, made once a gang


def _group(ranks: list[int]):
    """The process group of `ranks`, made on every gang rank once and kept (the gang's own
    groups of its first k ranks where they exist)."""
    if tuple(ranks) not in _KEPT:
        _KEPT[tuple(ranks)] = dist.new_group(ranks)
    return _KEPT[tuple(ranks)]


def _groups(env, case: EPCase):
    """This rank's EP groups for the case, made (or found) on every gang rank."""
    return build_expert_groups(case.ep, members=range(case.world), make=_group)


def rank_make_groups(env, case: EPCase) -> None:
    """Every gang rank: make the case's EP groups before a step that runs on some ranks only."""
    _groups(env, case)


def rank_ep_step(env, case: EPCase):
    """On ranks [0, world) of the gang: one EP step; (loss, full gradients, the ledger's EP
    all-to-all bytes by phase). A step of lengths runs on every gang rank (each takes part in
    making the pool's groups; those outside it return None)."""
    pool = _pool(env, case) if case.lengths else None
    groups = _groups(env, case) if case.lengths else None
    out = None
    if env.rank < case.world:
        groups = groups or build_expert_groups(case.ep, members=range(case.world),
                                               make=lambda ranks: _KEPT[tuple(ranks)])
        out = (_lengths_step(case, groups, pool) if case.lengths
               else _fixed_step(env, case, groups))
    if case.lengths:
        gc.collect()
        dist.barrier()  # every rank done with the pool's groups before any is destroyed
        for g in pool.groups() if pool is not None else ():
            if g is not step_check._WHOLE.get(case.world):
                dist.destroy_process_group(g)
    return out


def _pool(env, case: EPCase):
    """The static deal's SP groups, built on every gang rank (its first case.world ranks)."""
    used = sorted({m.group for m in case.the_deal().micro if m.size > 1})
    axes = tuple(algorithms.get(case.algorithm).axes)
    return build_pool([(g, algorithms.grid_for(case.algorithm, len(g)), axes) for g in used],
                      members=range(case.world), whole=step_check._whole(case.world, env.world))


def _net(case: EPCase, groups, **kw) -> Transformer:
    return Transformer(family(case.family), dtype=torch.float64, seed=case.seed,
                       states=case.states, checkpoint=case.checkpoint, ep=case.ep,
                       experts=groups, **kw)


def _fixed_step(env, case: EPCase, groups):
    net = _net(case, groups, attention=case.algorithm, layout=case.layout, mesh=env.mesh)
    replica = env.mesh.coord("dp") if case.dp > 1 else 0
    with ledger.recording() as book:
        loss = net.loss(case.tokens()[replica:replica + 1])
        loss.backward()
    return loss.item(), net.full_grads(), _a2a(book)


def _lengths_step(case: EPCase, groups, pool):
    d = case.the_deal()
    net = _net(case, groups, attention="local", shard_group=pool.whole)
    sizes = {m.size for m in d.micro} | {1}
    model = StepModel.build(net, pool, {n: (case.algorithm if n > 1 else "local", {})
                                        for n in sizes}, case.layout)
    seqs = case.lengths_of()
    with ledger.recording() as book:
        res = train_step(model, d, lambda i: seqs[i], pool.pos)
    grads = net.full_grads()
    del model
    return res.loss, grads, _a2a(book)


def _a2a(book: ledger.Ledger) -> dict[str, int]:
    return {phase: book.total(phase=phase, op="all_to_all", group="ep")
            for phase in ("forward", "backward")}


def reference(case: EPCase) -> tuple[float, dict[str, torch.Tensor], list[torch.Tensor]]:
    """The one-process model's loss and gradients on the same tokens, and each MoE layer's
    chosen experts (rows: batch row, then position)."""
    net = Transformer(family(case.family), dtype=torch.float64, seed=case.seed)
    chosen: list[torch.Tensor] = []

    def route(*args, **kwargs):
        r = plain_route(*args, **kwargs)
        chosen.append(r.experts)
        return r

    plain_route, moe.route = moe.route, route
    try:
        if case.lengths:
            seqs = case.lengths_of()
            total = sum(len(t) - 1 for t in seqs)
            loss = sum(net(pack=pack_of([t])) for t in seqs) / total
        else:
            loss = net.loss(case.tokens())
    finally:
        moe.route = plain_route
    loss.backward()
    grads = {k: p.grad for k, p in net.named_parameters() if p.grad is not None}
    return loss.item(), grads, chosen


def analytic_bytes(case: EPCase, chosen: list[torch.Tensor]) -> list[int]:
    """Each rank's all-to-all bytes of one direction (forward or backward) from the one-process
    routing: over the MoE layers, (rows sent + rows received) x hidden x 8 (`rules.groups`)."""
    cfg = family(case.family)
    held = [positions(case.layout, r % case.sp, case.sp, case.seq_len) for r in range(case.world)]
    out = [0] * case.world
    for experts in chosen:  # one MoE layer: (dp x N, k)
        counts = [torch.bincount(experts[[r // case.sp * case.seq_len + p for p in held[r]]]
                                 .reshape(-1), minlength=cfg.experts).tolist()
                  for r in range(case.world)]
        for r, (sent, got) in enumerate(ep_rows(counts, case.ep)):
            out[r] += (sent + got) * cfg.hidden * 8
    return out


def check(gang, case: EPCase) -> list[dict[str, int]]:
    """The EP step on every rank against the one-process model; each rank's all-to-all bytes."""
    if case.lengths:
        got = gang.run(rank_ep_step, case)[:case.world]
    else:
        gang.run(rank_make_groups, case)
        got = gang.run(rank_ep_step, case, size=case.world, mesh=case.mesh_key())
    want_loss, want, chosen = reference(case)
    for rank, (loss, grads, _) in enumerate(got):
        assert abs(loss - want_loss) <= 1e-10 * abs(want_loss), (case.label(), rank, loss)
        assert set(grads) == set(want), (case.label(), set(want) ^ set(grads))
        for k, g in want.items():
            err = (grads[k] - g).abs().max().item() / max(g.abs().max().item(), 1e-30)
            assert err <= 1e-8, f"{case.label()} rank {rank}: {k} off by {err:.2e}"
    booked = [bytes_ for _, _, bytes_ in got]
    if not case.lengths:  # each rank's all-to-all bytes: the count from the routing
        want_bytes = analytic_bytes(case, chosen)
        factor = 2 if case.checkpoint != "none" else 1  # a recomputed forward sends again
        for rank, b in enumerate(booked):
            assert b == {"forward": factor * want_bytes[rank], "backward": want_bytes[rank]}, (
                case.label(), rank, b, want_bytes[rank])
    return booked
