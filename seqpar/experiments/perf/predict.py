"""One attention layer's predicted forward + backward on a cluster: time, bytes, exposed
communication per link class, and the bottleneck, from the algorithm's schedule.

Ring stages (all rings of the stage at once; a step lasts as long as its slowest rank):
    forward, per inner ring:  sum over its first w-1 steps of max(compute, inner transfer) + last compute
    backward, per inner ring: the same with K,V (or the query block) and the gradient that follows it
                              one step behind on the link; the last gradient's trip home is exposed
    outer step: max(inner ring, outer prefetch) — the prefetch overlaps the whole inner ring
Collectives and placement sends are not overlapped with compute.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from seqpar.algorithms.base import AttnShape
from seqpar.algorithms.groups import DoubleRing
from seqpar.experiments.clusters import Cluster
from seqpar.experiments.perf import kernel
from seqpar.experiments.perf.net import Cost, Net
from seqpar.experiments.perf.schedule import P2P, Collective, Kernel, Ring, Stage, schedule


@dataclass
class Timing:
    """What one attention call costs on the busiest rank."""

    seconds: float = 0.0
    compute_s: float = 0.0
    flops: float = 0.0           # the busiest rank's attention FLOPs
    exposed: dict[str, float] = field(default_factory=lambda: {"intra": 0.0, "inter": 0.0})
    bytes_intra: int = 0
    bytes_inter: int = 0
    stages: list[tuple[str, float]] = field(default_factory=list)

    def add(self, label: str, seconds: float, compute: float, cost: Cost, flops: float = 0.0) -> None:
        self.seconds += seconds
        self.compute_s += compute
        self.flops += flops
        if seconds > compute:
            self.exposed[cost.link] += seconds - compute
        self.bytes_intra += cost.intra
        self.bytes_inter += cost.inter
        self.stages.append((label, seconds))

    @property
    def bottleneck(self) -> str:
        worst = max(self.exposed, key=lambda k: self.exposed[k])
        if self.exposed[worst] > 0.1 * self.seconds:
            return f"{worst}-node communication"
        return "compute"


@dataclass(frozen=True)
class Job:
    cluster: Cluster
    shape: AttnShape
    world: int
    nodes: int
    layout: str
    causal: bool
    dtype: str
    _blocks: dict = field(default_factory=dict, compare=False, repr=False)

    @cached_property
    def net(self) -> Net:
        return Net(self.cluster, self.world, self.nodes)

    def block(self, q: tuple[int, ...], k: tuple[int, ...], heads: int) -> tuple[float, float]:
        """(seconds, FLOPs) of the forward kernel calls of q_members' queries on k_members' keys
        (memoised per job: a ring visits each pair once per step and phase)."""
        key = (q, k, heads)
        got = self._blocks.get(key)
        if got is None:
            calls = kernel.block_calls(self.layout, self.world, q, k, self.causal)
            got = self._blocks[key] = kernel.block_seconds(
                self.cluster, self.dtype, self.shape.batch, self.shape.seq_len, heads,
                self.shape.head_dim, calls, self.world)
        return got


def _ring_time(job: Job, st: Ring, timing: Timing) -> None:
    net, n, w = job.net, st.size, st.inner
    outer = n // w
    steps = [(o, i) for o in range(outer) for i in range(w)]
    schedules = [DoubleRing(n, w, pos) for pos in range(n)]
    comp, flops = [], []
    for o, i in steps:  # the slowest rank of every ring sets each step
        worst, worst_f = 0.0, 0.0
        sources = [(pos, schedules[pos].source(o, i)) for pos in range(n)]
        for r in range(1 if st.same_blocks else len(st.rings)):
            for pos, src in sources:
                sec, f = job.block(*st.blocks(r, pos, src), st.heads)
                if sec > worst:
                    worst, worst_f = sec, f
        comp.append(worst * st.factor)
        flops.append(worst_f * st.factor)
    total_compute = sum(comp)
    if n == 1:
        timing.add(st.label, total_compute, total_compute, Cost(0.0), sum(flops))
        return
    inner_pairs = [(ring[p], ring[DoubleRing(n, w, p).next_inner]) for ring in st.rings
                   for p in range(n)]
    outer_pairs = [(ring[p], ring[DoubleRing(n, w, p).next_outer]) for ring in st.rings
                   for p in range(n)]
    def both(pairs):  # the block and the gradient behind it: one link, or (emulated) each its own
        if job.cluster.shared_links or not st.grad:
            return net.p2p(pairs, st.msg + st.grad)
        a, b = net.p2p(pairs, st.msg), net.p2p(pairs, st.grad)
        return Cost(max(a.seconds, b.seconds), a.intra + b.intra, a.inter + b.inter)

    x_in = both(inner_pairs) if w > 1 else Cost(0.0)
    x_out = both(outer_pairs) if outer > 1 else Cost(0.0)
    home = net.p2p(outer_pairs if outer > 1 else inner_pairs, st.grad)
    seconds = 0.0
    for o in range(outer):
        c = comp[o * w:(o + 1) * w]
        inner_time = sum(max(ci, x_in.seconds) for ci in c[:-1]) + c[-1]
        seconds += max(inner_time, x_out.seconds) if o < outer - 1 else inner_time
    seconds += home.seconds
    cost = max((x_in, x_out), key=lambda x: x.seconds)
    # bytes by link: the busiest rank's messages, inner and outer hops as the ring makes them
    intra = inter = 0
    for x, count in ((x_in, (w - 1) * outer), (x_out, outer - 1)):
        intra += x.intra * count
        inter += x.inter * count
    last = st.nbytes - intra - inter
    if last > 0:
        if home.inter:
            inter += last
        else:
            intra += last
    timing.add(st.label, seconds, total_compute, Cost(cost.seconds, intra, inter), sum(flops))


def attention(job: Job, name: str, options: Mapping[str, Any]) -> tuple[Timing, Timing]:
    """(forward, backward) timings of one attention call."""
    sched = schedule(name, job.shape, job.world, options, job.nodes)
    out = []
    for phase in ("forward", "backward"):
        timing = Timing()
        for st in sched.phases[phase]:
            _stage(job, st, timing)
        out.append(timing)
    return out[0], out[1]


def _stage(job: Job, st: Stage, timing: Timing) -> None:
    if isinstance(st, Collective):
        cost = job.net.collective(st.groups, st.nbytes)
        timing.add(st.label, cost.seconds, 0.0, cost)
    elif isinstance(st, P2P):
        cost = job.net.p2p(st.pairs, st.nbytes)
        timing.add(st.label, cost.seconds, 0.0, cost)
    elif isinstance(st, Kernel):
        sec, f = job.block(st.q_members, st.k_members, st.heads)
        timing.add(st.label, sec * st.factor, sec * st.factor, Cost(0.0), f * st.factor)
    else:
        _ring_time(job, st, timing)
