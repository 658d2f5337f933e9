"""Which SP policy, algorithm and training policy trains a length distribution fastest: every
split of the pool (static SP degree d x best-fit or cost-balanced packs; dynamic groups), dealt by
`rules.deal` with the planner's cost model (the runner's deal), every attention configuration
timed on those micro-batches with its own rates (`perf.lengths`), ranked by TGS.

    plan = LengthPlan.make(cluster, "llama3.1-8b", work, world=64, nodes=16)
    steps = plan.search()        # LengthStep per (split, attention configuration, states)

A step (`LengthStep`) = the deal's free-schedule makespan (replicated or zero1 states: each rank
runs its micro-batches as soon as its group is free) or its rounds (FSDP over the pool: every round
waits for its longest micro-batch and FSDP's gathers and reduce-scatters of the round), + the
gradient all-reduce over the pool once a step (replicated, zero1) + AdamW (zero1: over its share,
then the parameters' broadcast). Its parts, in ms, sum to the step: `attention`,
`attention_comm`, `other_compute`, `recompute` (each the mean rank's), `idle` (what the mean rank
waits: the imbalance), `exposed_comm` (FSDP's time past the rounds, the gradient reduction,
zero1's broadcast), `optimizer`. `imbalance` is max / mean of the ranks' attention FLOPs (the runner's
`load_imbalance`), `busy_imbalance` of their busy seconds, `gap` the deal's own makespan over its
lower bound. Training policies: states replicated, zero1 (AdamW's moments sharded over the pool)
or FSDP over the pool (the dynamic policy with equal micro-batch counts), the checkpoint modes but
seq-attn, the fused head, tiling; per states the fastest that fits (no offload).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np

from seqpar.errors import ConfigError, require
from seqpar.planner import host, memory
from seqpar.planner.api import attention_peak
from seqpar.planner.clusters import Cluster
from seqpar.planner.fsdp import traffic
from seqpar.planner.lengths import (
    SizeRates,
    Table,
    Workload,
    deal_cost,
    issue_s,
    layout_rank_pairs,
    size_rates,
    span,
)
from seqpar.planner.lengths_step import GROUP_SIZES, PARTS, STATES, LengthStep, Split
from seqpar.planner.policy import REPLICATED, Filters, Policy, space, split_checkpoint
from seqpar.planner.rates import DEFAULT_KERNEL, with_kernel
from seqpar.planner.search import attention_space, pareto
from seqpar.planner.step import Setup, _optimizer_seconds, layer_seconds
from seqpar.planner.trial import policy_of_case
from seqpar.rules import algorithms
from seqpar.rules import lengths as length_rules
from seqpar.rules.deal import DEGREES, POLICIES, CostModel, deal, in_rounds
from seqpar.rules.flops import BACKWARD_FLOPS, gemm_flops, step_flops
from seqpar.rules.layouts import LAYOUTS
from seqpar.rules.model import ModelConfig, load
from seqpar.rules.pool import AUTO, LOCAL, options_at
from seqpar.rules.shape import DTYPE_BYTES, AttnShape


@dataclass
class LengthPlan:
    """What one plan of lengths holds fixed (`make`), and its deals and rates, memoised."""

    cluster: Cluster                 # with the kernel's rates
    cfg: ModelConfig
    work: Workload
    world: int
    nodes: int
    dtype: str = "bfloat16"
    kernel: str = DEFAULT_KERNEL
    kernel_source: str = ""
    skipped: dict[str, str] = field(default_factory=dict)  # split -> why it was not planned
    # algorithm -> why it cannot run at a group size the deal uses (the runner's refusal)
    unrunnable: dict[str, ConfigError] = field(default_factory=dict)
    _tables: dict[Split, list[Table]] = field(default_factory=dict, repr=False)
    _rates: dict[tuple, SizeRates] = field(default_factory=dict, repr=False)
    _memo: dict[tuple, Any] = field(default_factory=dict, repr=False)
    dominated: int = 0   # attention configurations pruned: another is as good on every rate

    @classmethod
    def make(cls, cluster: Cluster, model: str | ModelConfig, work: Workload, world: int,
             nodes: int = 1, *, dtype: str = "bfloat16", kernel: str = DEFAULT_KERNEL
             ) -> LengthPlan:
        cfg = model if isinstance(model, ModelConfig) else load(model)
        c, source = with_kernel(cluster, kernel, cfg.head_dim, dtype)
        return cls(c, cfg, work, world, nodes, dtype, kernel, source)

    @property
    def per_node(self) -> int:
        return max(1, self.world // self.nodes)

    @cached_property
    def cost(self) -> CostModel:
        """The cost model every split is dealt by (`deal_cost`: the driver's)."""
        return self.cost_of(False)

    def cost_of(self, any_size: bool) -> CostModel:
        """`cost`, with a ring's rates at every group size under `any_size` (`deal_cost`)."""
        key = ("cost", any_size)
        if key not in self._memo:
            self._memo[key] = deal_cost(self.cfg, self.cluster, self.dtype,
                                        window=self.work.window, capacity=self.work.capacity,
                                        world=self.world, ranks_per_node=self.per_node,
                                        any_size=any_size)
        return self._memo[key]

    @cached_property
    def setup(self) -> Setup:
        return Setup(self.cluster, self.cfg, self.work.capacity, None, self.world, self.nodes,
                     self.dtype, 1, self.kernel, self.kernel_source)

    def tables(self, split: Split) -> list[Table]:
        """Each batch's deal under `split` (`rules.deal.deal`, the runner's), as a Table."""
        got = self._tables.get(split)
        if got is None:
            half, window = self.cluster.kernel_half_tokens, self.work.window
            if split.equal_counts:  # the free deal's micro-batches in rounds (`deal` does so)
                free = self.tables(Split("dynamic", any_size=split.any_size,
                                         degrees=split.degrees))
                got = [Table.of(in_rounds(t.deal), half, window) for t in free]
            else:
                extra = ({"degree": split.degree} if split.policy == "static" else
                         {"any_size": split.any_size, "degrees": split.degrees})
                got = [Table.of(deal(lengths, self.world, self.work.capacity, split.policy,
                                     self.cost_of(split.any_size), packing=split.packing,
                                     ranks_per_node=self.per_node, **extra), half, window)
                       for lengths in self.work.draws]
            self._tables[split] = got
        return got

    def rates(self, d: int, name: str, options: dict[str, Any], layout: str) -> SizeRates:
        key = (d, name, tuple(sorted(options.items())), layout)
        got = self._rates.get(key)
        if got is None:
            got = self._rates[key] = size_rates(
                self.cluster, self.cfg, self.dtype, d, self.work.capacity, name, options, layout,
                world=self.world, nodes=self.nodes, window=self.work.window)
        return got

    def shape(self, d: int) -> AttnShape:
        return AttnShape(1, d * self.work.capacity, self.cfg.heads, self.cfg.kv_heads,
                         self.cfg.head_dim, DTYPE_BYTES[self.dtype])

    # ------------------------------------------------------------------------------ the search
    def splits(self, policies: tuple[str, ...] = POLICIES, packings: tuple[str, ...] =
               ("best-fit", "cost-balanced"), sp: int | None = None, any_size: bool = False,
               degrees: str = "smallest") -> list[Split]:
        """Every split the filters leave whose groups hold the longest sequence drawn (the
        dynamic ones of any group size with `any_size`)."""
        longest = max(max(b) for b in self.work.draws)
        out = []
        if "static" in policies:
            for d in range(1, self.world + 1):
                if self.world % d or not (self.per_node % d == 0 or d % self.per_node == 0):
                    continue
                if sp is not None and d != sp:
                    continue
                if d * self.work.capacity < longest:
                    self.skipped[f"static sp={d}"] = (f"the longest sequence ({longest} tokens) "
                                                      f"does not fit d x {self.work.capacity}")
                    continue
                out += [Split("static", d, p) for p in packings]
        if "dynamic" in policies:
            out += [Split("dynamic", any_size=any_size, degrees=degrees),
                    Split("dynamic", equal_counts=True, any_size=any_size, degrees=degrees)]
        return out

    def configs(self, split: Split, filters: Filters, layouts: tuple[str, ...]
                ) -> list[tuple[str, dict[str, Any], str, dict[int, tuple[str, dict]]]]:
        """(algorithm, options, layout, what each group size runs) of every configuration of a
        split: the algorithm's configurations at its largest group size, and at each smaller size
        the options `rules.pool.options_at` gives (what the runner runs)."""
        sizes = sorted({int(d) for t in self.tables(split) for d in t.size})
        top = sizes[-1]
        if top == 1:
            return [(LOCAL, {}, layouts[0], {1: (LOCAL, {})})]
        out = []
        if split.policy == "dynamic" and filters.algorithm in (None, AUTO):
            out += [(AUTO, {}, layout, self.auto(sizes, layout, filters)) for layout in layouts]
        if filters.algorithm == AUTO:
            return out
        for name, options in attention_space(top, filters):
            for layout in layouts:
                try:
                    algorithms.check(name, self.shape(top), top, layout, True, **options)
                    by_size = {d: (LOCAL, {}) if d == 1 else options_at(
                        name, d, options, self.cfg.heads, self.cfg.kv_heads, self.cfg.head_dim)
                        for d in sizes}
                except ConfigError as err:
                    if err.field == "sp_group":  # a size it cannot run: the runner refuses it
                        self.unrunnable.setdefault(name, err)
                    continue
                out.append((name, dict(options), layout, by_size))
        return out

    def auto(self, sizes: list[int], layout: str, filters: Filters
             ) -> dict[int, tuple[str, dict[str, Any]]]:
        """`algorithm: auto`: at each group size the algorithm and options predicted fastest for
        a full micro-batch there (its attention, exposed communication and host issue at that
        size: `rates`, `issue`), among those that run at that size; `local` on one rank."""
        out: dict[int, tuple[str, dict[str, Any]]] = {}
        for d in sizes:
            if d == 1:
                out[d] = (LOCAL, {})
                continue
            best, chosen = float("inf"), None
            for name, options in attention_space(d, replace(filters, algorithm=None)):
                try:
                    algorithms.check(name, self.shape(d), d, layout, True, **options)
                except ConfigError:
                    continue
                r = self.rates(d, name, options, layout)
                seconds = host.stretch(self.cluster, r.prediction.attention_ms / 1e3
                                       * self.cfg.layers, self.issue(d, name, options, layout,
                                                                     "none")[0])
                if seconds < best:
                    best, chosen = seconds, (name, dict(options))
            require(chosen is not None, "algorithm", AUTO,
                    f"no algorithm runs on a group of {d} ranks with this model "
                    f"({self.cfg.heads} heads, {self.cfg.kv_heads} KV heads) in {layout}")
            out[d] = chosen
        return out

    def policies(self, split: Split, filters: Filters) -> list[Policy]:
        """The training policies a split can run, fastest first within each states choice."""
        dp = self.world // (split.degree or self.world)
        found = [p for p in space(filters, dp, ((),), (False, True), self.world // dp,
                                  self.per_node, pinned=())
                 if p.states in STATES and not p.checkpoint.startswith("seq-attn")
                 and (p.states in REPLICATED or split.policy == "static" or split.equal_counts)
                 and (p.states == "dp_sp" or not split.equal_counts)]
        return sorted(found, key=lambda p: (p.states, self._recompute(p), p.fused_head))

    def _recompute(self, p: Policy) -> tuple[float, bool]:
        mode, frac = split_checkpoint(p.checkpoint)
        share = {"none": 0.0, "full": 1.0, "sc++": 1.0}.get(mode, frac)
        g, mlp, ew, _ = self.token_rates
        return share * (g + ew) + (1.0 - share) * mlp * p.tiled, mode == "full"

    @cached_property
    def token_rates(self) -> tuple[float, float, float, float]:
        """(GEMMs, MLP GEMMs, element-wise, head) forward seconds a token, one layer (the head
        once), at a micro-batch of capacity tokens a rank."""
        cap = self.work.capacity
        return tuple(x / cap for x in layer_seconds(self.cluster, self.cfg, self.dtype, cap,
                                                    self.world))  # type: ignore[return-value]

    def memory(self, by_size: dict[int, tuple[str, dict]], policy: Policy) -> dict[str, int]:
        """The step's memory on the rank that holds most: the largest over the group sizes used
        of a full micro-batch's (capacity tokens a rank) under `policy`."""
        key = ("memory", tuple((d, n, tuple(sorted(o.items()))) for d, (n, o) in
                               sorted(by_size.items())), policy)
        if key in self._memo:
            return self._memo[key]
        train, worst = policy.train(self.dtype), {"peak": -1}
        for d, (name, options) in by_size.items():
            shape, dp = self.shape(d), self.world // d
            peak = attention_peak(name, shape, d, options, span(d, self.world, self.nodes))
            comms = (memory.communicators(name, d, dp, policy.states, self.per_node)
                     + len(by_size) - 1) if self.cluster.cores is None else 0
            got = memory.step_memory(name, shape, d, options, self.cfg, train, peak, self.dtype,
                                     dp=dp, shards=policy.shards(dp, d, self.per_node),
                                     comms=comms)
            if got["peak"] > worst["peak"]:
                worst = got
        self._memo[key] = worst
        return worst

    def step(self, split: Split, name: str, options: dict[str, Any], layout: str,
             by_size: dict[int, tuple[str, dict]], policy: Policy) -> LengthStep:
        """One configuration's step (see the module docstring), the mean over the batches."""
        cfg, layers, train = self.cfg, self.cfg.layers, policy.train(self.dtype)
        sizes = sorted(by_size)
        rates = [self.rates(d, *by_size[d], layout) for d in sizes]
        g, mlp, ew, hd = self.token_rates
        rec_lin, full = self._recompute(policy)
        fsdp = policy.states == "dp_sp"
        key = ("traffic", policy.states, train.master_dtype)
        comm = self._memo.get(key)
        if comm is None:
            comm = self._memo[key] = traffic(self.setup.net, cfg, self.dtype, self.world, 1,
                                             policy, train)
        round_comm = layers * max(comm.busy(k) for k in ("intra", "inter")) if fsdp else 0.0
        edges = comm.gather.seconds + comm.scatter.seconds + comm.root
        reduce = 0.0 if fsdp else layers * comm.reduce.seconds + comm.reduce_root + (
            comm.update.seconds)  # zero1's broadcast of the updated parameters
        optimizer = _optimizer_seconds(self.setup, cfg, policy, train, self.world, 1)
        issue = [self.issue(d, *by_size[d], layout, train.checkpoint, train.fused_head)
                 for d in sizes]
        once = self.issue_once(train.states)
        overlaps = host.overlaps(self.cluster)
        device_total = host_total = 0.0
        tables = self.tables(split)
        totals = dict.fromkeys(PARTS, 0.0)
        spans, busy_imb, rank_pairs, flops = [], [], np.zeros(self.world), [0.0, 0.0, 0.0]
        for t in tables:
            at = np.searchsorted(sizes, t.size)

            def of(key: str, at: np.ndarray = at) -> np.ndarray:
                return np.array([getattr(r, key) for r in rates])[at]

            attn = of("attention") * t.eff
            exposed = np.maximum(0.0, of("link") * t.tokens - of("hidden") * attn)
            per_rank = t.tokens / t.size
            other = (3 * layers * (g + ew) + hd) * per_rank
            rec = layers * rec_lin * per_rank + (of("forward") * (attn + exposed) if full else 0.0)
            device = attn + exposed + other + rec
            docs = t.docs if t.docs is not None else np.ones_like(t.tokens)
            issued = (np.array([i[0] for i in issue])[at]
                      + (docs - 1) * np.array([i[1] for i in issue])[at])
            seconds = np.maximum(device, issued) if overlaps else device + issued
            totals["host"] += float(((seconds - device) * t.size).sum()) / self.world
            device_total += float((device * t.size).sum()) / self.world
            host_total += float((issued * t.size).sum()) / self.world
            busy, span = t.schedule(seconds)
            mean = float(busy.mean())
            if fsdp:
                longest = t.rounds(seconds)
                span = float(np.maximum(longest, round_comm).sum()) + len(longest) * edges
                late = span - float(longest.sum())
                span_busy = float(longest.sum())
            else:
                span, late, span_busy = span + reduce, reduce, span
            for key, part in (("attention", attn), ("attention_comm", exposed),
                              ("other_compute", other), ("recompute", rec)):
                totals[key] += float((part * t.size).sum()) / self.world
            totals["idle"] += span_busy - mean
            totals["exposed_comm"] += late
            spans.append(span + host.stretch(self.cluster, optimizer, once))
            totals["host"] += host.stretch(self.cluster, optimizer, once) - optimizer
            device_total, host_total = device_total + optimizer, host_total + once
            busy_imb.append(float(busy.max()) / mean if mean > 0 else 1.0)
            rank_pairs += t.rank_pairs
            flops[0] += float(t.causal.sum() if self.work.window is None else t.pairs.sum())
            flops[1] += float(t.square.sum())
            flops[2] += float(t.pairs.sum())
        k = len(tables)
        totals["optimizer"] = optimizer * k
        seconds = sum(spans) / k
        mem = self.memory(by_size, policy)
        tokens = self.work.tokens
        mode, frac = split_checkpoint(policy.checkpoint)
        share = {"none": 0.0, "full": 1.0, "sc++": 1.0}.get(mode, frac)
        attn_flop = 4.0 * cfg.heads * cfg.head_dim * cfg.layers
        recomputed = cfg.layers * share * gemm_flops(cfg, tokens) + (
            attn_flop * flops[2] / k if full else 0.0)
        peak = self.cluster.peak(self.dtype) * self.world * seconds
        degrees: dict[int, int] = {}
        for t in tables:
            for d, n in t.degrees.items():
                degrees[d] = degrees.get(d, 0) + n
        return LengthStep(
            split, name if len(sizes) > 1 or sizes[0] > 1 else LOCAL, options, dict(by_size),
            layout, policy, self.work.capacity, self.world, self.kernel, 1e3 * seconds,
            tokens / (seconds * self.world),
            step_flops(cfg, 1, tokens, flops[0] / k) / peak,
            step_flops(cfg, 1, tokens, flops[1] / k) / peak,
            (step_flops(cfg, 1, tokens, flops[2] / k, BACKWARD_FLOPS) + recomputed) / peak,
            float(rank_pairs.max() / rank_pairs.mean()) if rank_pairs.mean() > 0 else 1.0,
            sum(busy_imb) / k, sum(t.deal.gap for t in tables) / k,
            sum(float(t.size.sum()) for t in tables) / (k * self.world),
            {d: round(n / k, 2) for d, n in sorted(degrees.items())}, mem["peak"],
            mem["peak"] <= self.cluster.memory_gb * 1e9,
            {key: 1e3 * v / k for key, v in totals.items()}, mem,
            host_bound=host.bound(self.cluster, device_total, host_total))

    def issue(self, d: int, name: str, options: dict[str, Any], layout: str, checkpoint: str,
              fused_head: bool = False) -> tuple[float, float]:
        """(host issue seconds of a micro-batch of one document on d ranks, each further
        document's) under `checkpoint` (`lengths.issue_s`, memoised)."""
        key = ("issue", d, name, tuple(sorted(options.items())), layout, checkpoint, fused_head)
        if key not in self._memo:
            def at(docs: int, lay: str) -> float:
                return issue_s(self.cluster, self.cfg, d, name, options, lay, self.world,
                               checkpoint=checkpoint, kernel=self.kernel, docs=docs,
                               fused_head=fused_head)

            # each further document's calls: counted in zigzag, whose packs of equal documents
            # cross every rank (in contiguous and balanced layouts the table's documents each
            # fall in one rank's shard: its law does not hold there, `rules.ops`)
            self._memo[key] = (at(1, layout), max(0.0, (at(4, "zigzag") - at(2, "zigzag")) / 2))
        return self._memo[key]

    def issue_once(self, states: str) -> float:
        """Host issue seconds of the step's own work on one rank: the optimizer, the gradient
        reduction (`planner.host.step_seconds`, a CPU host's cores shared out)."""
        key = ("issue_once", states)
        if key not in self._memo:
            got = host.step_seconds(self.cluster, self.cfg, states=states, world=self.world,
                                        kernel=self.kernel)
            self._memo[key] = host.on_host(self.cluster, got, self.world)
        return self._memo[key]

    def search(self, filters: Filters = Filters(), policies: tuple[str, ...] = POLICIES,
               packings: tuple[str, ...] = ("best-fit", "cost-balanced"),
               every: bool = False, group_sizes: str = GROUP_SIZES[0],
               degrees: str = DEGREES[0]) -> list[LengthStep]:
        """Every split, attention configuration and states choice (the fastest policy of it that
        fits, else its most frugal), fitting ones first by TGS, then the rest by memory. Static
        degrees go up from the smallest that holds the longest sequence and stop after two in a
        row whose best step is slower than the best so far (a larger group trains the same
        micro-batches a replica with more communication); `every` searches every degree.
        `group_sizes` (`GROUP_SIZES`): the dynamic policy's, as the sweep's field names them."""
        require(group_sizes in GROUP_SIZES, "group-sizes", group_sizes,
                f"must be one of {', '.join(GROUP_SIZES)} (the sweep's plan.group_sizes)")
        require(degrees in DEGREES, "degrees", degrees,
                f"must be one of {', '.join(DEGREES)} (the sweep's plan.degrees)")
        out: list[LengthStep] = []
        best, worse = float("inf"), 0
        for split in self.splits(policies, packings, filters.sp, group_sizes == "any", degrees):
            if split.policy == "static" and worse >= 2 and not every:
                self.skipped[f"static sp={split.degree}"] = "slower at the two SP degrees below"
                continue
            mine = self._split(split, filters)
            out += mine
            if split.policy == "static" and split.packing == packings[-1]:
                here = min((s.step_ms for s in out if s.fits and s.split.policy == "static"
                            and s.split.degree == split.degree), default=float("inf"))
                worse = 0 if here < best else worse + 1
                best = min(best, here)
        return sorted(out, key=lambda s: (not s.fits, -s.tgs if s.fits else s.peak_mem_bytes))

    def _split(self, split: Split, filters: Filters) -> list[LengthStep]:
        """The steps of one split: its attention configurations no other beats on every rate and
        memory (the equal ones as alternatives), each under the fastest policy that fits per
        states choice."""
        layouts = ((filters.layout,) if filters.layout else
                   tuple(lay for lay in LAYOUTS if lay != "contiguous"))
        budget, chosen, out = self.cluster.memory_gb * 1e9, self.policies(split, filters), []
        configs = self.configs(split, filters, layouts)
        kept, same, beaten = pareto([self._metrics(*c[2:]) for c in configs])
        self.dominated += len(beaten)
        for i in kept:
            name, options, layout, by_size = configs[i]
            for states in dict.fromkeys(p.states for p in chosen):
                mine = [p for p in chosen if p.states == states]
                fit = next((p for p in mine if self.memory(by_size, p)["peak"] <= budget), None)
                least = fit or min(mine, key=lambda p: self.memory(by_size, p)["peak"])
                s = self.step(split, name, options, layout, by_size, least)
                s.alternatives = [(configs[j][1], configs[j][2]) for j in same[i]]
                out.append(s)
        return out

    def _metrics(self, layout: str, by_size: dict[int, tuple[str, dict]]) -> tuple:
        """Everything a step depends on from its attention configuration, lower is better (its
        rates and memory at each group size): `search.pareto` prunes what another beats."""
        out: list[float] = []
        for d in sorted(by_size):
            name, options = by_size[d]
            r = self.rates(d, name, options, layout)
            held = memory.attention_held(name, self.shape(d), d, options)
            out += [r.attention, r.link, 1.0 - r.hidden, r.forward,
                    *self.issue(d, name, options, layout, "none"),
                    r.prediction.peak_mem_bytes, held.saved, held.saved - held.recomputable,
                    int(held.relayout), memory.AXES.get(name, 0)]
        return tuple(out)


def predict_case(case: Any, cluster: Cluster, nodes: int = 1) -> LengthStep:
    """A training trial of lengths (a TrainCase with its batches dealt) as it runs: its own deals,
    algorithm, options at each group size, layout and policy (`seqpar plan --validate`)."""
    work = Workload(length_rules.parse(case.lengths), case.tokens_per_step, case.seq_len,
                    case.capacity, len(case.batches), case.seed, case.window)
    plan = LengthPlan.make(cluster, case.config(), work, case.world, nodes, dtype=case.dtype,
                           kernel=cluster.kernel or DEFAULT_KERNEL)
    split = Split(case.sp_policy, case.sp if case.sp_policy == "static" else None, case.packing,
                  case.equal_counts, case.any_size, getattr(case, "degrees", DEGREES[0]))
    plan._tables[split] = [Table.of(b.deal, plan.cluster.kernel_half_tokens, case.window)
                           for b in case.batches]
    by_size = {d: case.options_at(d) for d in case.group_sizes()}
    policy = policy_of_case(case)[0]
    s = plan.step(split, case.algorithm, dict(case.options), case.layout, by_size, policy)
    pairs = sum(layout_rank_pairs(b.deal, case.layout, case.window) for b in case.batches)
    s.imbalance = float(pairs.max() / pairs.mean()) if pairs.mean() > 0 else 1.0
    return s


def auto_algorithms(cluster: Cluster, cfg: ModelConfig, dtype: str, capacity: int, world: int,
                    nodes: int, sizes: list[int], layout: str, window: int | None = None
                    ) -> dict[int, tuple[str, dict[str, Any]]]:
    """`algorithm: auto` for a run: what each group size of its deals runs (`LengthPlan.auto`),
    chosen on the driver with the same rates the plan uses."""
    work = Workload(length_rules.parse(f"fixed:{capacity}"), world * capacity, capacity,
                    capacity, window=window)
    plan = LengthPlan.make(cluster, cfg, work, world, max(1, nodes), dtype=dtype,
                           kernel=cluster.kernel or DEFAULT_KERNEL)
    return plan.auto(sorted(sizes), layout, Filters(layout=layout))
