"""The host's cost of issuing one operation on this machine (`Cluster.dispatch_us`): the runner's
own step of sequences (`model.step.train_step`, one rank) over 64 micro-batches of one 16-token
sequence each, so small that its FLOPs and bytes are nothing, timed in the thread's own CPU time
(the least of its repeats: other processes on a busy machine do not count), over the operations
that launch work in it, counted by the same rule as `rules.ops`' table
(`workers.measure.opcount`; the attention kernel's own operations too: on a CPU they are
dispatches like the rest). The mix is the runner's: forward operations issued from Python with
autograd recording and the step's own Python around them (packs, records), backward ones from the
autograd engine, AdamW's. A few seconds."""

from __future__ import annotations

import math
import statistics
import time

import numpy as np
import torch
import torch.distributed as dist

from seqpar.experiments.steps import make_case
from seqpar.planner.clusters import Cluster
from seqpar.planner.lengths_time import predict_case
from seqpar.platform.localgang import LocalGang, free_port
from seqpar.rules.model import param_shapes
from seqpar.workers.measure.opcount import OpCounter
from seqpar.workers.measure.varlen import build, build_pool, pool_groups, run_batches

TOKENS = 16        # a sequence
SEQUENCES = 64     # a step: each its own micro-batch
REPEATS = 7


def dispatch_seconds(repeats: int = REPEATS) -> tuple[float, int]:
    """(host seconds per launching operation, operations a step) of the tiny step on one
    thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    own = not dist.is_initialized()
    if own:  # the step reduces over its pool: a pool of one
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                                world_size=1)
    try:
        case = make_case("ring", 1, f"fixed:{TOKENS}", tokens=TOKENS * SEQUENCES,
                         capacity=TOKENS, policy="dynamic", dtype="float32", longest=TOKENS)
        cpu = torch.device("cpu")
        model = build(case, build_pool(pool_groups(case, None)), cpu)
        opt = model.net.optimizer(1e-3)

        def once() -> None:
            run_batches(model, case, 0, opt, cpu)

        for _ in range(2):
            once()
        with OpCounter() as counter:
            once()
        ops = sum(t.ops + t.kernel_ops + t.collectives + t.messages
                  for t in counter.tallies.values())
        times = []
        for _ in range(repeats):
            start = time.thread_time()
            once()
            times.append(time.thread_time() - start)
    finally:
        if own:
            dist.destroy_process_group()
        torch.set_num_threads(threads)
    least = min(times)
    spread = statistics.median(times) / least if least > 0 else 1.0
    assert spread < 10, f"the tiny step's CPU time varies {spread:.1f}x: too noisy to measure"
    return least / ops, ops


# ------------------------------------------------------------- a step's messages and collectives
WAIT_SEQUENCES = 32  # a step: each of 32 tokens on the group of 2 (16 a rank)


def _tiny_step(algorithm: str, world: int = 2):
    return make_case(algorithm, world, f"fixed:{world * TOKENS}",
                     tokens=world * TOKENS * WAIT_SEQUENCES, capacity=TOKENS, policy="static",
                     dtype="float32", longest=world * TOKENS)


def rank_step_costs(env, algorithm: str, repeats: int, world: int = 2
                    ) -> tuple[list[float], int, int, int]:
    """On one rank of a LocalGang: (the wall seconds of each of `repeats` tiny steps of
    all-rank micro-batches under `algorithm`, each after a barrier, its launching operations,
    messages, collectives)."""
    torch.set_num_threads(1)
    case = _tiny_step(algorithm, world)
    cpu = torch.device("cpu")
    model = build(case, build_pool(pool_groups(case, None)), cpu)
    opt = model.net.optimizer(1e-3)
    for _ in range(2):
        run_batches(model, case, env.rank, opt, cpu)
    with OpCounter() as counter:
        run_batches(model, case, env.rank, opt, cpu)
    tallies = counter.tallies.values()
    ops = sum(t.ops + t.kernel_ops for t in tallies)
    messages = sum(t.messages for t in tallies)
    collectives = sum(t.collectives for t in tallies)
    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        run_batches(model, case, env.rank, opt, cpu)
        times.append(time.perf_counter() - start)
    return times, ops, messages, collectives


def rank_queued(env, world: int, repeats: int) -> list[float]:
    """On one rank of a LocalGang: the wall seconds of each of `repeats` rounds of the tiny
    step's gradient all-reduces (a tensor each, `rules.model.param_shapes`) posted back to back
    and waited on together, as `model.grads.GradSync` and `model.step.reduce_grads` do, each
    round after a barrier."""
    torch.set_num_threads(1)
    grads = [torch.ones(math.prod(s))
             for s in param_shapes(_tiny_step("ring", world).config()).values()]
    times = []
    for _ in range(repeats + 1):
        dist.barrier()
        start = time.perf_counter()
        for work in [dist.all_reduce(g, async_op=True) for g in grads]:
            work.wait()
        times.append(time.perf_counter() - start)
    return times[1:]


def queued_wait(cluster: Cluster, gang: LocalGang, world: int, repeats: int = 15) -> float:
    """Seconds a collective queued behind another costs a rank beyond its dispatch: the tiny
    step's gradient all-reduces posted back to back on `world` ranks, the median round (the
    slowest rank's) over the all-reduces, less a dispatch each."""
    got = gang.run(rank_queued, world, repeats)
    wall = statistics.median(max(r) for r in zip(*got, strict=True))
    tensors = len(param_shapes(_tiny_step("ring", world).config()))
    return max(0.0, wall / tensors - cluster.dispatch_us * 1e-6)


def step_waits(cluster: Cluster, repeats: int = 5, world: int = 2
               ) -> tuple[float, float, float]:
    """(host seconds a message, a collective and a queued collective (`queued_wait`) cost a step
    of `world` ranks on this host beyond what `cluster` already charges: posting it, the
    transport's threads, the wait on the peers on the shared cores). The tiny step of all-rank
    micro-batches under ring (its messages) and allgather (its collectives), both with the
    gradient's all-reduces, measured in wall time as a trial's `step_ms` is (the slowest rank's
    each step, the median over steps); each one's residual over the planner's prediction of it
    without these costs (`planner.lengths_time.predict_case`), solved for the two."""
    rows, rhs = [], []
    with LocalGang(world) as gang:
        queued = queued_wait(cluster, gang, world)
        free = cluster.model_copy(update={"waits_us": {world: (0.0, 0.0, queued * 1e6)}})
        for algorithm in ("ring", "allgather"):
            got = gang.run(rank_step_costs, algorithm, repeats, world)
            wall = statistics.median(max(steps) for steps in zip(*(g[0] for g in got), strict=True))
            messages, collectives = (max(g[k] for g in got) for k in (2, 3))
            # the gradient's all-reduces queue behind the first (`rules.ops.Issue.queued`)
            behind = len(param_shapes(_tiny_step(algorithm, world).config())) - 1
            rows.append([messages, collectives - behind])
            rhs.append(wall - predict_case(_tiny_step(algorithm, world), free).step_ms / 1e3)
    per_message, per_collective = np.linalg.solve(np.array(rows, float), np.array(rhs))
    return max(0.0, float(per_message)), max(0.0, float(per_collective)), queued
