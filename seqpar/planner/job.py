"""What one prediction is about (`Job`: cluster, shape, world, nodes, layout, dtype, with the work
beside the kernel) and what it accumulates (`Timing`): shared by the overlap structure
(`predict.py`) and the ring stages (`ring.py`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from seqpar.planner import kernel
from seqpar.planner.clusters import Cluster
from seqpar.planner.net import Cost, Net
from seqpar.rules import masks
from seqpar.rules.flops import flop_width
from seqpar.rules.shape import AttnShape


@dataclass
class Timing:
    """What one attention call costs on the busiest rank."""

    seconds: float = 0.0
    compute_s: float = 0.0
    flops: float = 0.0           # the busiest rank's attention FLOPs
    exposed: dict[str, float] = field(default_factory=lambda: {"intra": 0.0, "inter": 0.0})
    # how long the call keeps each link class busy (its busiest link): the time other traffic on
    # those links (FSDP's, in a training step) must share with it
    busy: dict[str, float] = field(default_factory=lambda: {"intra": 0.0, "inter": 0.0})
    bytes_intra: int = 0
    bytes_inter: int = 0
    stages: list[tuple[str, float]] = field(default_factory=list)

    def add(self, label: str, seconds: float, compute: float, cost: Cost, flops: float = 0.0,
            busy: dict[str, float] | None = None) -> None:
        """A stage: its seconds, the compute in them, its bytes and its links' busy time (default:
        the cost's own, one transfer)."""
        self.seconds += seconds
        self.compute_s += compute
        self.flops += flops
        for link in self.busy:
            self.busy[link] += busy[link] if busy is not None else cost.busy(link)
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
    mask: masks.Mask | None = None  # any mask but plain causal / full (those: `causal`)

    @property
    def any_mask(self) -> bool:
        """Whether blocks follow a mask, each (queries, keys) pair of its own (not only whether
        the keys come before, at or after the queries, as under plain causal attention)."""
        return self.mask is not None and not self.mask.plain

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
        key = (self._cluster_key, self.shape, self.world, self.layout, self.causal, self.dtype,
               self.mask)
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
            calls = (kernel.mask_calls(self.layout, self.world, q, k, self.mask) if self.any_mask
                     else kernel.block_calls(self.layout, self.world, q, k, self.causal))
            shard = self.shape.seq_len / self.world
            got = self._blocks[key] = kernel.block_seconds(
                self.cluster, self.dtype, self.shape.batch, self.shape.seq_len, heads,
                flop_width(self.shape.head_dim, self.shape.v_dim), calls, len(q) * shard,
                len(k) * shard)
        return got

    def work(self, b: kernel.Block, heads: int, factor: float, accumulate: bool) -> float:
        """One rank's seconds for a block, on one core (device): the kernel calls (forward, or
        backward at `factor`) and, when their results go into accumulators, the work beside them:
        forward merges each call's partial output, backward adds the block's dq, dk, dv (in the
        accumulation dtype; an output row and dv at the value width, dq and dk at the query/key
        width)."""
        seconds = b.seconds * factor
        if factor != 1.0:  # backward, at the backward kernel's own rate
            seconds *= self.cluster.backward_slowdown(self.dtype)
        if not accumulate:
            return seconds
        row = self.shape.batch * heads * self.shape.acc_bytes
        d, v = self.shape.head_dim, self.shape.v_dim
        c = self.cluster
        if factor == 1.0:
            return seconds + c.merge_seconds(b.q_rows * v * row, b.calls)
        return seconds + c.copy_seconds((b.q_len * d + b.k_len * (d + v)) * row)

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
