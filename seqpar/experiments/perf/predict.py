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

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from seqpar.algorithms.base import AttnShape
from seqpar.experiments.clusters import Cluster
from seqpar.experiments.perf import kernel
from seqpar.experiments.perf.net import Cost, Net
from seqpar.experiments.perf.ring import ring_time
from seqpar.experiments.perf.schedule import P2P, Collective, Kernel, Stage, schedule


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

    @cached_property
    def _cluster_key(self) -> str:
        """The cluster's content (a plan's jobs share one Cluster object: dumped once)."""
        held = _DUMPED.get(id(self.cluster))
        if held is None or held[0] is not self.cluster:
            if len(_DUMPED) >= 32:
                _DUMPED.clear()
            held = _DUMPED[id(self.cluster)] = (self.cluster, self.cluster.model_dump_json())
        return held[1]

    @cached_property
    def net(self) -> Net:
        """The links, shared by every job on the same cluster, world and nodes."""
        key = ("net", self._cluster_key, self.world, self.nodes)
        got = _SHARED.get(key)
        if got is None:
            got = _SHARED[key] = Net(self.cluster, self.world, self.nodes)
        return got

    @cached_property
    def _blocks(self) -> dict:
        """Block costs, shared by every job on the same cluster, shape, world, layout and dtype
        (a plan's configurations meet the same blocks again and again)."""
        key = (self._cluster_key, self.shape, self.world, self.layout, self.causal, self.dtype)
        got = _SHARED.get(key)
        if got is None:
            if len(_SHARED) >= 32:
                _SHARED.clear()
            got = _SHARED[key] = {}
        return got

    def block(self, q: tuple[int, ...], k: tuple[int, ...], heads: int) -> kernel.Block:
        """The forward kernel calls of q_members' queries on k_members' keys (memoised: a ring
        visits each pair once per step and phase)."""
        key = (q, k, heads)
        got = self._blocks.get(key)
        if got is None:
            calls = kernel.block_calls(self.layout, self.world, q, k, self.causal)
            shard = self.shape.seq_len / self.world
            got = self._blocks[key] = kernel.block_seconds(
                self.cluster, self.dtype, self.shape.batch, self.shape.seq_len, heads,
                self.shape.head_dim, calls, len(q) * shard, len(k) * shard)
        return got

    def work(self, b: kernel.Block, heads: int, factor: float, accumulate: bool) -> float:
        """One rank's seconds for a block, on one core (device): the kernel calls (forward, or
        backward at `factor`) and, when their results go into accumulators, the work beside them:
        forward merges each call's partial output, backward adds the block's dq, dk, dv (in the
        accumulation dtype)."""
        seconds = b.seconds * factor
        if not accumulate:
            return seconds
        row = self.shape.batch * heads * self.shape.head_dim * self.shape.acc_bytes
        c = self.cluster
        if factor == 1.0:
            return seconds + c.merge_seconds(b.q_rows * row, b.calls)
        return seconds + c.copy_seconds((b.q_len + 2 * b.k_len) * row)

    def ring_work(self, q: tuple[int, ...], k: tuple[int, ...], heads: int,
                  factor: float) -> tuple[float, float]:
        """(seconds, FLOPs) of a ring step's block with its accumulation (memoised)."""
        key = (q, k, heads, factor)
        got = self._blocks.get(key)
        if got is None:
            b = self.block(q, k, heads)
            got = self._blocks[key] = (self.work(b, heads, factor, True), b.flops)
        return got

    def host(self, worst: float, total: float | None = None) -> float:
        """A stage's time from its busiest rank's work and every rank's (default: all as busy)."""
        return self.cluster.host_seconds(worst, worst * self.world if total is None else total,
                                         self.world)


_SHARED: dict[tuple, Any] = {}
_DUMPED: dict[int, tuple[Cluster, str]] = {}


def attention(job: Job, name: str, options: Mapping[str, Any]) -> tuple[Timing, Timing]:
    """(forward, backward) timings of one attention call."""
    sched = schedule(name, job.shape, job.world, options, job.nodes)
    out = []
    call = job.host(job.cluster.call_us * 1e-6 / 2)  # the call's fixed host cost, half per phase
    for phase in ("forward", "backward"):
        timing = Timing()
        if call:
            timing.add("host call", call, call, Cost(0.0))
        for st in sched.phases[phase]:
            _stage(job, st, timing)
        out.append(timing)
    return out[0], out[1]


def _collective_host(job: Job, groups: list[list[int]], nbytes: int) -> tuple[float, float]:
    """(copies, transport) seconds of a collective on the busiest rank, host cores shared: it packs
    and unpacks its whole buffer (what it sends is (G-1)/G of it) and, on a host transport, sends
    and receives nbytes in a message to and from every peer."""
    g = max(map(len, groups), default=1)
    if g < 2 or nbytes <= 0:
        return 0.0, 0.0
    c = job.cluster
    copies = job.host(c.copy_seconds(2 * nbytes * g / (g - 1)) + c.collective_us * 1e-6)
    return copies, job.host(c.transport_seconds(2 * nbytes, 2 * (g - 1)))


def _stage(job: Job, st: Stage, timing: Timing) -> None:
    if isinstance(st, Collective):
        cost = job.net.collective(st.groups, st.nbytes)
        copies, transport = _collective_host(job, st.groups, st.nbytes)
        timing.add(st.label, copies + max(cost.seconds, transport), copies, cost)
    elif isinstance(st, P2P):
        cost = job.net.p2p(st.pairs, st.nbytes)
        moving = any(s != d for s, d in st.pairs) and st.nbytes > 0
        transport = job.host(job.cluster.transport_seconds(2 * st.nbytes, 2)) if moving else 0.0
        timing.add(st.label, max(cost.seconds, transport), 0.0, cost)
    elif isinstance(st, Kernel):
        b = job.block(st.q_members, st.k_members, st.heads)
        t = job.host(job.work(b, st.heads, st.factor, b.calls > 1))
        timing.add(st.label, t, t, Cost(0.0), b.flops * st.factor)
    else:
        ring_time(job, st, timing)
