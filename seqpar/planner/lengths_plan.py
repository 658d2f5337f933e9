"""Which SP policy, algorithm and training policy trains a length distribution fastest: every
split of the pool (static SP degree d x best-fit or cost-balanced packs; dynamic groups), dealt by
`rules.deal` with the planner's cost model (the runner's deal), every attention configuration
timed on those micro-batches with its own rates (`lengths_time`), ranked by TGS.

    plan = LengthPlan.make(cluster, "llama3.1-8b", work, world=64, nodes=16)
    steps = plan.search()        # LengthStep per (split, attention configuration, states)

Training policies: states replicated, zero1 (AdamW's moments sharded over the pool) or FSDP over
the pool (the dynamic policy with equal micro-batch counts), the checkpoint modes but seq-attn, the
fused head, tiling; per states the fastest that fits (no offload). A hybrid's linear layers under
the faster of LASP-2 and LASP-1 for the step (the runner runs one a step). What the plan holds
fixed and prices is `lengths_costs.LengthCosts`; `algorithm: auto` is `lengths_auto`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from seqpar.errors import ConfigError, require
from seqpar.planner import memory
from seqpar.planner.lengths_auto import choose
from seqpar.planner.lengths_costs import LengthCosts
from seqpar.planner.lengths_step import GROUP_SIZES, STATES, LengthStep, Split
from seqpar.planner.lengths_time import time_step
from seqpar.planner.policy import REPLICATED, Filters, Policy, space
from seqpar.planner.search import attention_space, pareto
from seqpar.rules import algorithms
from seqpar.rules.deal import DEGREES, POLICIES
from seqpar.rules.layouts import LAYOUTS
from seqpar.rules.linear import check_lasp
from seqpar.rules.pool import AUTO, LOCAL, options_at


@dataclass
class LengthPlan(LengthCosts):
    """A plan of lengths: its splits, their attention configurations and training policies, and
    the search over them (`search`), with what it left out and why."""

    skipped: dict[str, str] = field(default_factory=dict)  # split -> why it was not planned
    # algorithm -> why it cannot run at a group size the deal uses (the runner's refusal)
    unrunnable: dict[str, ConfigError] = field(default_factory=dict)
    dominated: int = 0   # attention configurations pruned: another is as good on every rate

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
            out += [(AUTO, {}, layout, choose(self, sizes, layout, filters)) for layout in layouts]
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

    def policies(self, split: Split, filters: Filters) -> list[Policy]:
        """The training policies a split can run, fastest first within each states choice."""
        dp = self.world // (split.degree or self.world)
        found = [p for p in space(filters, dp, ((),), (False, True), self.world // dp,
                                  self.per_node, pinned=())
                 if p.states in STATES and not p.checkpoint.startswith("seq-attn")
                 and (p.states in REPLICATED or split.policy == "static" or split.equal_counts)
                 and (p.states == "dp_sp" or not split.equal_counts)]
        return sorted(found, key=lambda p: (p.states, self.recompute(p), p.fused_head))

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
        states choice and, a hybrid's, the faster LASP (`lasps`; neither changes the memory)."""
        layouts = ((filters.layout,) if filters.layout else
                   tuple(lay for lay in LAYOUTS if lay != "contiguous"))
        if "linear" in self.cfg.layer_types:  # LASP passes one state a rank: contiguous
            check_lasp(self.cfg, filters.layout or "contiguous", self.world)
            layouts = ("contiguous",)
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
                s = min((time_step(self, split, name, options, layout, by_size, least, lasp)
                         for lasp in self.lasps(by_size)), key=lambda t: t.step_ms)
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

