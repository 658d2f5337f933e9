"""A step of variable-length sequences as the planner sees it: the deal's cost model from the
planner's own rates (`deal_cost`, what the driver deals a run by), each attention configuration's
rates on a group of d ranks (`SizeRates`), and the micro-batches of a deal (`rules.deal`, the
runner's own) timed with them (`Table`).

    work = Workload.of("lognormal:mean=1024,sigma=1.5,min=128,max=8192", tokens=2**20,
                       longest=8192, capacity=2048)
    cost = deal_cost(cfg, cluster, "bfloat16", world=16, ranks_per_node=4)
    d = deal(work.draws[0], 16, 2048, "dynamic", cost, ranks_per_node=4)

A micro-batch of sequences n_1..n_k (T tokens) on d ranks, one configuration, per rank:
- attention: A_d x sum_i pairs(n_i) x (1 + half x d / n_i), its kernels on the busiest rank (the
  sum of L² over sequences; a short sequence's calls at the kernel's lower rate, `half` the
  cluster's `kernel_half_tokens`), the softmax layers' (MLA's with its ring's cheaper pass,
  `mla_pass`); a hybrid's linear layers M_d x T / d (their chunked rule, `Setup.linear` at the
  mixer's rate) and its LASP's exposed exchange a micro-batch, whatever its lengths (LASP-2's
  all-gather of states or LASP-1's chain, the faster for the step: `LengthCosts.lasps`);
- SP communication: max(0, K_d x T - rho_d x attention): the group's links busy K_d a token,
  hidden under rho_d of the attention's compute (1 for a ring that hides it, 0 for all-to-alls);
- the rest: GEMMs, element-wise work, the head and the recompute, per token / d;
- the host's issue of the micro-batch (`issue_s`: `planner.host`, the counted operations of its
  layers and head at the cluster's rates), added on a CPU and overlapping the rest on a GPU.
A_d, K_d and rho_d come from the attention scope's prediction of one full micro-batch (a causal
sequence of d x capacity tokens on d ranks: `predict`): its kernels, its links' busy time and the
part of it left exposed. So a step costs what its distribution's sequences cost, not its mean's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np

from seqpar.errors import require
from seqpar.planner import host
from seqpar.planner.api import Prediction, predict
from seqpar.planner.clusters import Cluster
from seqpar.planner.compute import linear_at_rate
from seqpar.planner.net import Net
from seqpar.planner.setup import Setup
from seqpar.planner.step import layer_seconds
from seqpar.rules import lengths as length_rules
from seqpar.rules import masks
from seqpar.rules.cost_model import CostModel
from seqpar.rules.flops import BACKWARD_FLOPS
from seqpar.rules.layouts import positions as layout_positions
from seqpar.rules.lengths import boundaries
from seqpar.rules.micro_batches import Deal
from seqpar.rules.model import ModelConfig
from seqpar.rules.pool import pool_groups, pool_sizes
from seqpar.rules.shape import DTYPE_BYTES, AttnShape

DEFAULT_BATCHES = 2  # seeded batches a plan deals and times (a run replays workload.batches)


@dataclass(frozen=True)
class Workload:
    """What a plan of lengths holds fixed: the distribution, tokens a step, the longest sequence
    a step holds (seq_len), tokens a rank holds in a micro-batch, the batches drawn."""

    dist: length_rules.Distribution
    tokens: int
    longest: int
    capacity: int
    batches: int = DEFAULT_BATCHES
    seed: int = 0
    window: int | None = None

    @classmethod
    def of(cls, spec: str, tokens: int, longest: int, capacity: int, **kw: Any) -> Workload:
        return cls(length_rules.parse(spec), tokens, longest, capacity, **kw)

    @cached_property
    def draws(self) -> tuple[tuple[int, ...], ...]:
        """The lengths of each batch (`rules.lengths.draw_batches`: what the runner draws)."""
        return tuple(tuple(s.length for s in b) for b in length_rules.draw_batches(
            self.dist, self.tokens, self.longest, self.seed, self.batches))

    @property
    def spec(self) -> str:
        return self.dist.spec

    def check(self, world: int) -> None:
        """The rules of a plan's lengths, one line each: the capacity, the tokens a step (at
        least the shortest sequence), the longest sequence drawn against the whole pool."""
        require(self.capacity >= 1, "capacity", self.capacity, "must be a positive number of "
                "tokens a rank holds in a micro-batch")
        least = min(self.dist.low, self.longest)
        require(self.tokens >= least, "tokens-per-step", self.tokens,
                f"must hold at least the shortest sequence ({least} tokens)")
        longest = max(max(b) for b in self.draws)
        require(longest <= world * self.capacity, "capacity", self.capacity,
                f"a sequence of {longest} tokens is longer than the whole pool holds: {world} "
                f"ranks x {self.capacity} tokens = {world * self.capacity}")


def pairs_of(n: np.ndarray, window: int | None) -> np.ndarray:
    """Visible pairs of causal sequences of n tokens (under a window, if any)."""
    if window is None:
        return n * (n + 1) / 2.0
    w = np.minimum(n, window)
    return w * (w + 1) / 2.0 + (n - w) * w


def span(d: int, world: int, nodes: int) -> int:
    """Nodes the pool's first group of d ranks spans (`rules.pool.pool_groups`: inside a node
    where it fits one, else ranks 0..d-1): ceil(d / ranks a node), what its rates are timed on
    (`ring_link_s` times the same group)."""
    return -(-d // max(1, world // nodes))


def issue_s(c: Cluster, cfg: ModelConfig, d: int, name: str, options: dict[str, Any],
            layout: str, world: int, *, checkpoint: str = "none", kernel: str = "flash2",
            docs: int = 1, fused_head: bool = False, linear_sp: str = "lasp2") -> float:
    """Host seconds one rank spends issuing a micro-batch of `docs` documents on d ranks
    (`planner.host`: the counted operations at the cluster's issue rates, a hybrid's linear
    layers' exchange under `linear_sp`, a CPU host's cores shared out among `world` ranks)."""
    algorithm = "local" if d == 1 else name
    got = host.micro_seconds(c, cfg, algorithm=algorithm, d=d, layout=layout, options=options,
                             checkpoint=checkpoint, kernel=kernel, docs=docs,
                             mask="documents" if docs > 1 else "causal", fused_head=fused_head,
                             world=world, linear_sp=linear_sp)
    return host.on_host(c, got, world)


def ring_link_s(net: Net, cfg: ModelConfig, dtype: str, d: int, tokens: int,
                ranks_per_node: int) -> float:
    """Seconds a ring of d ranks (the pool's first group of d) keeps its links busy carrying the
    K,V of `tokens` tokens forward and K,V, dK, dV backward, every layer."""
    group = pool_groups(net.world, d, ranks_per_node)[0]
    pairs = [(group[i], group[(i + 1) % d]) for i in range(d)]
    shard = tokens // d * 2 * cfg.kv_heads * cfg.head_dim * DTYPE_BYTES.get(dtype, 2)
    return 3 * softmax_layers(cfg) * (d - 1) * net.p2p(pairs, shard).seconds


def softmax_layers(cfg: ModelConfig) -> int:
    """Layers whose attention is softmax attention (a hybrid's others are linear)."""
    return cfg.layers - cfg.layer_types.count("linear")


def mixer_rates(cluster: Cluster, cfg: ModelConfig, dtype: str, d: int, capacity: int,
                world: int, nodes: int, linear_sp: str = "lasp2") -> tuple[float, float]:
    """A hybrid's linear layers on a group of d ranks, every one of them, forward + backward:
    (seconds a token of a rank, seconds a micro-batch whatever its tokens), from one full
    micro-batch of d x capacity tokens (`Setup.linear`: the chunked rule at the mixer's rate,
    `compute.linear_at_rate`; under `linear_sp` LASP-2's all-gather of states or LASP-1's chain,
    and the halo, exposed); (0, 0) without linear layers."""
    count = cfg.layer_types.count("linear")
    if not count:
        return 0.0, 0.0
    setup = Setup(cluster, cfg, d * capacity, None, d, span(d, world, nodes), dtype)
    q = linear_at_rate(cluster, cfg, dtype, setup.linear(d, linear_sp))
    return (count * q.compute_ms / 1e3 / capacity,
            count * max(0.0, q.attention_ms - q.compute_ms) / 1e3)


def deal_cost(cfg: ModelConfig, cluster: Cluster, dtype: str, *, window: int | None = None,
              capacity: int = 2048, world: int | None = None, nodes: int = 1,
              ranks_per_node: int | None = None, any_size: bool = False) -> CostModel:
    """The cost model a run's steps are dealt by (`rules.deal.CostModel`), from the planner's
    rates for `cfg` on `cluster` (its kernel and GEMM rates; give it `with_kernel`'s cluster to
    name the kernel): the attention per visible pair, forward + backward, every layer, at the
    kernel's rate at large calls and its small-call curve; the GEMMs, element-wise work and head
    per token at the rate of a micro-batch of `capacity` tokens a rank; per group size of a pool of
    `world` ranks (`ranks_per_node` a node; every size from 1 to the pool with `any_size`,
    `rules.pool.pool_sizes`), a ring's K,V per token over the links the group spans (`perf.net`),
    hidden under the attention; the host's issue of a micro-batch per group size (`issue_s`: the
    counted operations of a ring's, adding to the device's time on a CPU and overlapping it on a
    GPU). The
    algorithm's own costs refine it in the plan (`SizeRates`); the deal is the same for every
    algorithm, so a sweep over algorithms compares them on one deal."""
    softmax = softmax_layers(cfg)
    pair = 4.0 * cfg.heads * cfg.head_dim * softmax
    rate = cluster.call_rate(dtype, 1e9, "causal")
    attention = pair * (1.0 + BACKWARD_FLOPS * cluster.backward_slowdown(dtype)) / rate
    g, _, ew, hd = layer_seconds(cluster, cfg, dtype, capacity)
    linear = (3 * cfg.layers * (g + ew) + hd) / capacity + mixer_rates(
        cluster, cfg, dtype, 1, capacity, 1, 1)[0]
    kv = 3 * softmax * 2 * cfg.kv_heads * cfg.head_dim * DTYPE_BYTES.get(dtype, 2)
    comm_at: tuple[tuple[int, float], ...] = ()
    if world is not None and world > 1:
        rpn = ranks_per_node or max(1, world // nodes)
        net = Net(cluster, world, max(1, world // rpn))
        comm_at = tuple((d, ring_link_s(net, cfg, dtype, d, d * capacity, rpn) / (d * capacity))
                        for d in pool_sizes(world, any_size) if d > 1)
    world_ = world or 1
    fixed_at = tuple((d, issue_s(cluster, cfg, d, "ring", {}, "zigzag", world_,
                                 kernel=cluster.kernel or "flash2"))
        for d in ((1, *(d for d, _ in comm_at)) if comm_at else (1,)))
    return CostModel(attention=attention, linear=linear,
                     comm=kv / (cluster.intra.bandwidth_gb_per_s * 1e9), window=window,
                     comm_at=comm_at, overlap=True, half=float(cluster.kernel_half_tokens),
                     fixed=fixed_at[0][1], fixed_at=fixed_at,
                     host_overlaps=host.overlaps(cluster))


@dataclass(frozen=True)
class SizeRates:
    """One attention configuration on a group of d ranks, every layer (see the module docstring)."""

    size: int
    attention: float   # seconds per effective pair on the busiest rank, forward + backward
    link: float        # seconds per token the group's busiest link is busy
    hidden: float      # rho: the share of the attention's compute the link time hides under
    forward: float     # the forward's share of the attention's time (full checkpointing re-runs it)
    prediction: Prediction = field(compare=False)
    mixer: float = 0.0        # a hybrid's linear layers, seconds a token of a rank (`mixer_rates`)
    mixer_fixed: float = 0.0  # and seconds a micro-batch (LASP-2's exposed communication)


def size_rates(cluster: Cluster, cfg: ModelConfig, dtype: str, d: int, capacity: int,
               name: str, options: dict[str, Any], layout: str, *, world: int, nodes: int,
               window: int | None = None, mla_pass: str | None = None,
               linear_sp: str = "lasp2") -> SizeRates:
    """`SizeRates` of (name, options, layout) on d of `world` ranks over `nodes` nodes, from the
    attention scope's prediction of one full micro-batch (the host's issue apart: `issue_s`); an
    MLA model's ring with `mla_pass` (None: the faster of K,V and the latent, `Setup.latent`); a
    hybrid's linear layers under `linear_sp`."""
    n = d * capacity
    shape = AttnShape.of_model(cfg, 1, n, DTYPE_BYTES[dtype])
    mask = masks.parse(f"window:{window}", n) if window is not None and window < n else None
    p = predict(host.bare(cluster), name, shape, d, nodes=span(d, world, nodes), options=options,
                layout=layout, dtype=dtype, mask=mask)
    if cfg.mla:
        setup = Setup(cluster, cfg, n, None, d, span(d, world, nodes), dtype)
        kv = setup.attention(d, name, options, layout) if mask is None else p
        latent = setup.latent(d, kv) if mla_pass != "kv" else None
        p = latent if latent is not None and (mla_pass == "latent" or
                                              latent.attention_ms < kv.attention_ms) else kv
    layers = softmax_layers(cfg)
    eff = float(pairs_of(np.array([float(n)]), window)[0]) * (
        1.0 + cluster.kernel_half_tokens * d / n)
    compute, total = p.compute_ms / 1e3, p.attention_ms / 1e3
    busy = max(p.link_ms.values()) / 1e3 if d > 1 else 0.0
    exposed = max(0.0, total - compute)
    hidden = 1.0 if exposed <= 1e-9 * total else min(1.0, max(0.0, (busy - exposed) / compute))
    return SizeRates(d, layers * compute / eff, layers * busy / n, hidden,
                     p.forward_ms / max(p.attention_ms, 1e-12), replace(p),
                     *mixer_rates(cluster, cfg, dtype, d, capacity, world, nodes, linear_sp))


@dataclass
class Table:
    """The non-empty micro-batches of one deal as arrays, what every configuration's timing of
    it shares (`Table.of`): size, tokens, effective pairs (the kernel's small calls counted),
    visible pairs, pairs as the MFU conventions count them (n²/2 and n²), round, and the runs of
    consecutive micro-batches on one group (`run`: each one's run; `groups`: each run's ranks)."""

    deal: Deal
    size: np.ndarray
    tokens: np.ndarray
    eff: np.ndarray
    pairs: np.ndarray
    causal: np.ndarray
    square: np.ndarray
    round: np.ndarray
    run: np.ndarray
    groups: list[tuple[int, ...]]
    docs: np.ndarray | None = None  # documents (sequences) in each micro-batch

    @classmethod
    def of(cls, deal: Deal, half: float, window: int | None) -> Table:
        lengths = np.asarray(deal.lengths, dtype=np.float64)
        ms = [m for m in deal.micro if m.seqs]
        size = np.array([m.size for m in ms], dtype=np.int64)
        owner = np.repeat(np.arange(len(ms)), [len(m.seqs) for m in ms])
        n = lengths[np.concatenate([np.asarray(m.seqs, dtype=np.int64) for m in ms])]
        p = pairs_of(n, window)
        k = len(ms)
        groups: list[tuple[int, ...]] = []
        run = np.empty(k, dtype=np.int64)
        for i, m in enumerate(ms):
            if not groups or groups[-1] != m.group:
                groups.append(m.group)
            run[i] = len(groups) - 1

        def per(x: np.ndarray) -> np.ndarray:
            return np.bincount(owner, x, k)

        return cls(deal, size, per(n), per(p * (1.0 + half * size[owner] / n)), per(p),
                   per(n * n / 2.0), per(n * n), np.array([m.round for m in ms], dtype=np.int64),
                   run, groups, per(np.ones_like(n)))

    @cached_property
    def degrees(self) -> dict[int, int]:
        return self.deal.degrees

    @cached_property
    def _disjoint(self) -> np.ndarray | None:
        """Each run's group index when the groups used never overlap (a static deal), else
        None."""
        seen: dict[tuple[int, ...], int] = {}
        ranks: set[int] = set()
        for g in self.groups:
            if g not in seen:
                if ranks.intersection(g):
                    return None
                ranks.update(g)
                seen[g] = len(seen)
        return np.array([seen[g] for g in self.groups], dtype=np.int64)

    @cached_property
    def _members(self) -> tuple[list[tuple[int, ...]], np.ndarray, np.ndarray]:
        """(the distinct groups, each rank's group, run -> group) of a disjoint deal."""
        index = self._disjoint
        assert index is not None
        distinct = list(dict.fromkeys(self.groups))
        rank_group = np.full(self.deal.pool, -1, dtype=np.int64)
        for k, g in enumerate(distinct):
            rank_group[list(g)] = k
        return distinct, rank_group, index

    @cached_property
    def rank_pairs(self) -> np.ndarray:
        """Each rank's share of the visible pairs (an even split over its group)."""
        per_run = np.bincount(self.run, self.pairs / self.size, len(self.groups))
        ranks, owner = self._flat
        return np.bincount(ranks, per_run[owner], self.deal.pool)  # in run order, as a loop adds

    def schedule(self, seconds: np.ndarray) -> tuple[np.ndarray, float]:
        """(busy seconds per rank, makespan) of the free schedule at these micro-batch seconds:
        each starts when all its ranks are free, in the deal's order (`Deal._schedule`)."""
        per_run = np.bincount(self.run, seconds, len(self.groups))
        if self._disjoint is not None:  # groups never overlap: each runs its own micro-batches
            distinct, rank_group, index = self._members
            per_group = np.bincount(index, per_run, len(distinct))
            busy = np.where(rank_group >= 0, per_group[rank_group], 0.0)
            return busy, float(per_group.max(initial=0.0))
        free = [0.0] * self.deal.pool
        held = free.__getitem__
        for g, s in zip(self.groups, per_run.tolist(), strict=True):
            if len(g) == 1:
                free[g[0]] += s
            else:
                t = max(map(held, g)) + s
                for r in g:
                    free[r] = t
        ranks, owner = self._flat
        # each rank's seconds summed in run order, as adding each run's to its ranks would
        busy = np.bincount(ranks, per_run[owner], self.deal.pool)
        return busy, max(free, default=0.0)

    @cached_property
    def _flat(self) -> tuple[np.ndarray, np.ndarray]:
        """Every run's ranks in run order, and each one's run."""
        sizes = [len(g) for g in self.groups]
        ranks = np.fromiter((r for g in self.groups for r in g), dtype=np.int64, count=sum(sizes))
        return ranks, np.repeat(np.arange(len(self.groups)), sizes)

    def rounds(self, seconds: np.ndarray) -> np.ndarray:
        """The longest micro-batch of each round (rounds no micro-batch fills: 0)."""
        out = np.zeros(int(self.round.max()) + 1 if len(self.round) else 0)
        np.maximum.at(out, self.round, seconds)
        return out


def layout_rank_pairs(deal: Deal, layout: str, window: int | None = None) -> np.ndarray:
    """Each rank's visible pairs as the runner deals each pack in `layout` (its documents' causal
    pairs, under a window, at the positions each rank holds): what its attention kernels compute
    (`Table.rank_pairs` splits each pack evenly instead; this walks every token, for a trial)."""
    out = np.zeros(deal.pool)
    for m in deal.micro:
        if not m.seqs:
            continue
        cu = boundaries([deal.lengths[i] for i in m.seqs])
        starts = np.asarray(cu[:-1])
        for k, r in enumerate(m.group):
            held = (np.arange(cu[-1]) if m.size == 1 else
                    np.asarray(layout_positions(layout, k, m.size, cu[-1], cu)))
            seen = held - starts[np.searchsorted(starts, held, side="right") - 1] + 1
            out[r] += float((seen if window is None else np.minimum(seen, window)).sum())
    return out
