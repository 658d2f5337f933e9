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
from seqpar.workers.measure.probe import probe_inputs, probe_work
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
SPREAD_ROUNDS = 60  # runs of the probe's work side by side (a few ms each)


def _tiny_step(algorithm: str, world: int = 2):
    return make_case(algorithm, world, f"fixed:{world * TOKENS}",
                     tokens=world * TOKENS * WAIT_SEQUENCES, capacity=TOKENS, policy="static",
                     dtype="float32", longest=world * TOKENS)


def rank_step_costs(env, algorithm: str, repeats: int, world: int = 2
                    ) -> tuple[list[float], int, int, int, float]:
    """On one rank of a LocalGang: (the wall seconds of each of `repeats` tiny steps of
    all-rank micro-batches under `algorithm`, each after a barrier, its launching operations,
    messages, collectives, and the median CPU seconds a step its process spent outside this
    thread: the transport's threads)."""
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
    times, others = [], []
    for _ in range(repeats):
        dist.barrier()
        start, process, thread = time.perf_counter(), time.process_time(), time.thread_time()
        run_batches(model, case, env.rank, opt, cpu)
        times.append(time.perf_counter() - start)
        others.append(time.process_time() - process - (time.thread_time() - thread))
    return times, ops, messages, collectives, statistics.median(others)


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
               ) -> tuple[tuple[float, float, float], tuple[float, float], float]:
    """What a step of `world` ranks on this host costs beyond what `cluster` already charges:
    ((host seconds a message, a collective and a queued collective (`queued_wait`) cost a rank:
    posting it, the transport's threads, the wait on the peers on the shared cores), (CPU
    seconds a message and a collective cost the transport's own threads), the spread of equal
    work side by side (`spread`)). The tiny step of all-rank micro-batches under ring (its
    messages) and allgather (its collectives), both with the gradient's all-reduces, measured in
    wall time as a trial's `step_ms` is (the slowest rank's each step, the median over steps);
    each one's residual over the planner's prediction of it without these costs
    (`planner.lengths_time.predict_case`), solved for the two; the transport's CPU (every rank's
    own threads but the main one, the busiest rank's) solved alike over all the step's calls."""
    rows, rhs, calls, cpu = [], [], [], []
    with LocalGang(world) as gang:
        queued = queued_wait(cluster, gang, world)
        free = cluster.model_copy(update={"waits_us": {world: (0.0, 0.0, queued * 1e6)},
                                          "spread": {}, "transport_cpu_us": {}})
        for algorithm in ("ring", "allgather"):
            got = gang.run(rank_step_costs, algorithm, repeats, world)
            wall = statistics.median(max(steps) for steps in zip(*(g[0] for g in got), strict=True))
            messages, collectives = (max(g[k] for g in got) for k in (2, 3))
            # the gradient's all-reduces queue behind the first (`rules.ops.Issue.queued`)
            behind = len(param_shapes(_tiny_step(algorithm, world).config())) - 1
            rows.append([messages, collectives - behind])
            rhs.append(wall - predict_case(_tiny_step(algorithm, world), free).step_ms / 1e3)
            calls.append([messages, collectives])
            cpu.append(max(g[4] for g in got))
        spread_found = spread(gang, world)
    per_message, per_collective = np.linalg.solve(np.array(rows, float), np.array(rhs))
    cpu_message, cpu_collective = np.linalg.solve(np.array(calls, float), np.array(cpu))
    return ((max(0.0, float(per_message)), max(0.0, float(per_collective)), queued),
            (max(0.0, float(cpu_message)), max(0.0, float(cpu_collective))), spread_found)


def rank_segments(env, rounds: int) -> list[float]:
    """On one rank of a LocalGang: the wall seconds of `rounds` runs of the speed probe's work
    (`workers.measure.probe`: GEMMs and an attention pass, one thread), each after a barrier."""
    torch.set_num_threads(1)
    a, q = probe_inputs()
    probe_work(a, q)
    times = []
    for _ in range(rounds):
        dist.barrier()
        start = time.perf_counter()
        probe_work(a, q)
        times.append(time.perf_counter() - start)
    return times


def spread(gang: LocalGang, world: int, rounds: int = SPREAD_ROUNDS) -> float:
    """How much later than the mean the last of `world` ranks finishes equal work started
    together (E[max] / mean - 1 over `rounds` of the probe's work): a shared VM's cores each
    run at a speed of their own from moment to moment, so a balanced stage ends when its slowest
    rank does."""
    got = gang.run(rank_segments, rounds)
    rows = list(zip(*got, strict=True))
    return max(0.0, statistics.fmean(max(r) for r in rows)
               / statistics.fmean(statistics.fmean(r) for r in rows) - 1.0)
