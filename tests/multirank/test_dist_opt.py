"""`train.states: dist-opt` (Megatron-LM's distributed optimizer on FSDP2) on the shared gang:

- a step of lengths under the dynamic policy, ranks running different numbers of micro-batches
  (some none), equals the one-process model in float64 (loss and every gradient) at P = 2, 3, 4, 8,
  MHA and GQA, with no equal counts (`make test`: P = 3, and P = 4 with idle ranks);
- after optimizer steps every rank holds the parameters replicated states reach, and exactly its
  partition's states (`rules.memory.dist_opt_partition`); a step's traffic is the analytic count
  (`rules.memory.dist_opt_bytes`: one all-gather, one reduce-scatter), booked in the ledger;
- a fixed-N step (one micro-batch a rank) follows the one-process trajectory.
"""

from __future__ import annotations

import dataclasses

import pytest

from seqpar.algorithms import ledger
from seqpar.case import TrainCase
from seqpar.experiments.steps import make_case
from seqpar.model.memory import state_bytes
from seqpar.model.states import full
from seqpar.rules.memory import dist_opt_bytes, dist_opt_partition
from seqpar.rules.model import param_shapes
from seqpar.workers import step_check
from seqpar.workers.measure import train
from seqpar.workers.measure.varlen import run_batches

# (algorithm, pool, GQA, step tokens): tokens few enough (`idle`) at P = 4 and 8 that some ranks
# run nothing; make test: the uneven partition of 3 and idle ranks of 4 (P = 2, 8 and the busy
# P = 4 in make test-full: 8 ranks on 2 cores cost 4 times 4)
CASES = (pytest.param("ring", 2, False, 40, marks=pytest.mark.slow), ("allgather", 3, True, 60),
         pytest.param("ulysses", 4, False, 80, marks=pytest.mark.slow), ("burst", 4, True, 8),
         pytest.param("burst", 8, True, 16, marks=pytest.mark.slow))


def idle(world: int, tokens: int) -> bool:
    """Whether the case's draw must leave a rank with no micro-batch (2 tokens a rank or fewer)."""
    return tokens <= 2 * world


def shape(world: int, gqa: bool) -> tuple[tuple[str, int], ...]:
    heads = 6 if world == 3 else 8 if world == 8 else 4
    kv = (3 if world == 3 else 2) if gqa else heads
    return (("vocab", 61), ("heads", heads), ("kv_heads", kv), ("hidden", 8 * heads), ("ffn", 48))


def case_of(algorithm: str, world: int, gqa: bool, tokens: int, seed: int, batches: int = 2,
            states: str = "dist-opt") -> TrainCase:
    return make_case(algorithm, world, f"lognormal:mean=9,sigma=1.0,min=2,max={6 * world}",
                     tokens=tokens, capacity=6, policy="dynamic", seed=seed % 1000,
                     batches=batches, states=states, overrides=shape(world, gqa),
                     longest=6 * world)


@pytest.mark.multirank
@pytest.mark.parametrize(("algorithm", "world", "gqa", "tokens"), CASES)
def test_dist_opt_step_matches_one_process_with_unequal_counts(gang, seed, algorithm, world, gqa,
                                                               tokens):
    # the first draw whose ranks run unequal counts; case_of draws with seed % 1000, so 1,000 tries
    # visit every draw (at P = 2, 40 tokens, about 4% of them deal unequal counts)
    for s in range(seed, seed + 1000):
        case = case_of(algorithm, world, gqa, tokens, s)
        counts = [b.deal.counts for b in case.batches]
        if all(len(set(c)) > 1 for c in counts) and (
                not idle(world, tokens) or any(0 in c for c in counts)):
            break
    assert all(len(set(c)) > 1 for c in counts), counts  # no equal counts, no empty rounds
    if idle(world, tokens):
        assert any(0 in c for c in counts), counts  # a rank with no micro-batch joins with zeros
    got = step_check.compare(case, gang.run(step_check.rank_run, case), step_check.reference(case))
    assert got.ok, f"{case.label()} {counts}: {got.failures}"


def _trained_with_ledger(env, case: TrainCase):
    return step_check.on_pool(env, case, _steps)


def _steps(model, case: TrainCase, rank: int, device):
    opt = model.net.optimizer(case.lr)
    with ledger.recording() as book:
        run_batches(model, case, rank, opt, device)
    held = state_bytes(model.net, opt)
    params = {k: full(p).detach().cpu().clone() for k, p in model.net.named_parameters()}
    return params, held, book.total(group="states", op="all_gather"), \
        book.total(group="states", op="reduce_scatter")


@pytest.mark.multirank
def test_dist_opt_holds_its_partition_and_sends_the_analytic_bytes(gang, seed):
    """A pool of 3 (an uneven partition), two batches (two optimizer steps)."""
    cases = {s: case_of("ring", 3, True, 60, seed, states=s) for s in ("replicated", "dist-opt")}
    (want, _), *_ = gang.run(step_check.rank_trained, cases["replicated"])
    cfg = cases["dist-opt"].config()
    share, tensors = dist_opt_partition(cfg, 3), len(param_shapes(cfg))
    steps = len(cases["dist-opt"].batches)
    per_step = dist_opt_bytes(cfg, 3, 8, 8)  # float64 parameters and gradients
    assert sum(share) == cfg.params()
    for rank, (params, held, gathered, reduced) in enumerate(
            r for r in gang.run(_trained_with_ledger, cases["dist-opt"]) if r is not None):
        moved = max((params[k] - want[k]).abs().max().item() for k in want)
        assert moved < 1e-12, (rank, moved)
        # its rows' master weights and two moments (float64; gradients freed by zero_grad) and
        # AdamW's step count, a 4-byte scalar a parameter tensor
        assert held == 3 * 8 * share[rank] + 4 * tensors, (rank, held, share)
        assert gathered + reduced == steps * per_step, (rank, gathered, reduced, per_step)
        assert gathered == reduced  # float64 both ways


def _losses(env, case: TrainCase):
    return train.train_steps(case, env.rank, env.group(case.sp)).losses


@pytest.mark.multirank
def test_dist_opt_fixed_n_follows_the_one_process_trajectory(gang):
    case = TrainCase(algorithm="ring", sp=2, layout="zigzag", model="tiny",
                     model_overrides=(("vocab", 61), ("hidden", 32), ("ffn", 48)), seq_len=16,
                     batch=2, dtype="float64", warmup=1, iters=2, states="dist-opt")
    ref = train.train_steps(dataclasses.replace(case, algorithm="local", sp=1, layout="contiguous",
                                                states="replicated"), 0, None)
    for losses in gang.run(_losses, case, size=2):
        for a, b in zip(losses, ref.losses, strict=True):
            assert abs(a - b) < 1e-10, (losses, ref.losses)
