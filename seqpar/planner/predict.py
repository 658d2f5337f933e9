"""One attention layer's predicted forward + backward on a cluster: time, bytes, exposed
communication per link class, and the bottleneck, from the algorithm's schedule.

Ring stages (all rings of the stage at once; a step lasts as long as its slowest rank):
    forward, per inner ring:  sum over its first w-1 steps of max(compute, inner transfer) + last compute
    backward, per inner ring: the same with K,V (or the query block) and the gradient that follows it
                              one step behind on the link; the last gradient's trip home is exposed
    outer step: max(inner ring, outer prefetch) — the prefetch overlaps the whole inner ring
Collectives and placement sends are not overlapped with compute.

A step's compute is the kernel and the work beside it (Job.work: merges forward, accumulation
backward; the fixed step cost, the travelling gradient's packing, a host transport's sends and
receives). On a host with fewer cores than ranks a stage lasts at least all ranks' work over the
cores (Cluster.host_seconds); a host transport's collectives take the longer of its link time and
its ranks' own sending and receiving.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from seqpar.planner.job import Job, Timing
from seqpar.planner.net import ByIdentity, Cost
from seqpar.planner.ring import ring_time
from seqpar.planner.schedule import (
    P2P,
    Collective,
    Kernel,
    RingStage,
    Schedule,
    schedule,
)
from seqpar.rules import algorithms


def attention(job: Job, name: str, options: Mapping[str, Any]) -> tuple[Timing, Timing]:
    """(forward, backward) timings of one attention call."""
    sched = schedule(name, job.shape, job.world, options, job.nodes)
    if job.any_mask:
        sched = routed(sched, job, name, options)
    out = []
    call = job.host(job.cluster.call_us * 1e-6 / 2)  # the call's fixed host cost, half per phase
    for phase in ("forward", "backward"):
        timing = Timing()
        if call:
            timing.add("host call", call, call, Cost(0.0))
        for st in sched.phases[phase]:
            _STAGES.get(type(st), ring_time)(job, st, timing)
        out.append(timing)
    return out[0], out[1]


def routed(sched: Schedule, job: Job, name: str, options: Mapping[str, Any]) -> Schedule:
    """The schedule under the job's mask: its rings carry only what the route carries (the bytes a
    rank skips, `skipped_bytes_of`, taken off its ring stages' messages alike); collectives and
    all-to-alls move what they move."""
    skipped = algorithms.skipped_bytes_of(algorithms.get(name), job.shape, job.world,
                                          layout=job.layout, mask=job.mask, **options)
    out = Schedule()
    for phase, stages in sched.phases.items():
        ring = sum(st.nbytes for st in stages if isinstance(st, RingStage))
        keep = 1.0 - skipped[phase] / ring if ring else 1.0
        out.phases[phase] = [replace(st, msg=int(st.msg * keep), grad=int(st.grad * keep))
                             if isinstance(st, RingStage) else st for st in stages]
    return out


def _collective_host(job: Job, groups: list[list[int]], nbytes: int) -> tuple[float, float]:
    """(copies, transport) seconds of a collective on the busiest rank, host cores shared: it packs
    and unpacks its whole buffer (what it sends is (G-1)/G of it) and, on a host transport, sends
    and receives nbytes in a message to and from every peer."""
    g = _LARGEST.get(groups, lambda: max(map(len, groups), default=1))
    if g < 2 or nbytes <= 0:
        return 0.0, 0.0
    c = job.cluster
    copies = job.host(c.copy_seconds(2 * nbytes * g / (g - 1)) + c.collective_us * 1e-6)
    return copies, job.host(c.transport_seconds(2 * nbytes, 2 * (g - 1)))


_LARGEST = ByIdentity()  # a schedule's groups -> the largest group's size


def _collective(job: Job, st: Collective) -> tuple[float, float, Cost]:
    """(seconds, copies, cost) of a collective stage, memoised on the links and the groups: a
    plan's configurations post the same collectives under every layout and inner ring."""
    net = job.net
    key = (id(net), id(st.groups), st.nbytes)
    hit = _COLLECTIVES.get(key)
    if hit is not None and hit[0] is net and hit[1] is st.groups:
        return hit[2]
    cost = net.collective(st.groups, st.nbytes)
    copies, transport = _collective_host(job, st.groups, st.nbytes)
    got = (copies + max(cost.seconds, transport), copies, cost)
    if len(_COLLECTIVES) >= 4096:
        _COLLECTIVES.clear()
    _COLLECTIVES[key] = (net, st.groups, got)  # held: their ids are not reused while here
    return got


_COLLECTIVES: dict[tuple[int, int, int], tuple[Any, Any, tuple[float, float, Cost]]] = {}


def _collective_stage(job: Job, st: Collective, timing: Timing) -> None:
    seconds, copies, cost = _collective(job, st)
    timing.add(st.label, seconds, copies, cost)


def _p2p_stage(job: Job, st: P2P, timing: Timing) -> None:
    cost = job.net.p2p(st.pairs, st.nbytes)
    moving = any(s != d for s, d in st.pairs) and st.nbytes > 0
    transport = job.host(job.cluster.transport_seconds(2 * st.nbytes, 2)) if moving else 0.0
    timing.add(st.label, max(cost.seconds, transport), 0.0, cost)


def _kernel_stage(job: Job, st: Kernel, timing: Timing) -> None:
    b = job.block(st.q_members, st.k_members, st.heads)
    t = job.host(job.work(b, st.heads, st.factor, b.calls > 1))
    timing.add(st.label, t, t, Cost(0.0), b.flops * st.factor)


# how each kind of stage is timed (a ring stage: `ring.ring_time`)
_STAGES: dict[type, Callable[[Job, Any, Timing], None]] = {
    Collective: _collective_stage, P2P: _p2p_stage, Kernel: _kernel_stage}
