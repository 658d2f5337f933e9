"""What one plan of lengths holds fixed (`LengthCosts.make`: cluster, model, workload, pool) and
what it prices from it, memoised: each split's deals (`rules.deal`, the runner's, with the
driver's cost model), each group size's attention rates, a micro-batch's host issue, a token's
layer seconds and the step's memory. The search (`lengths_plan`), the step's timing
(`lengths_time`) and `algorithm: auto` (`lengths_auto`) all read these."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeVar

from seqpar.errors import require
from seqpar.planner import host, memory
from seqpar.planner.api import attention_peak
from seqpar.planner.clusters import Cluster
from seqpar.planner.fsdp import Traffic, traffic
from seqpar.planner.lengths import SizeRates, Table, Workload, deal_cost, issue_s, size_rates, span
from seqpar.planner.lengths_step import Split
from seqpar.planner.policy import Policy, split_checkpoint
from seqpar.planner.rates import DEFAULT_KERNEL, with_kernel
from seqpar.planner.step import Setup, layer_seconds
from seqpar.rules.cost_model import CostModel
from seqpar.rules.counts import model_params
from seqpar.rules.deal import deal
from seqpar.rules.flops import block_params
from seqpar.rules.linear import LASP_MODES
from seqpar.rules.memory import TrainPolicy
from seqpar.rules.micro_batches import in_rounds
from seqpar.rules.model import ModelConfig, load
from seqpar.rules.shape import DTYPE_BYTES, AttnShape

_C = TypeVar("_C", bound="LengthCosts")


@dataclass
class LengthCosts:
    """What one plan of lengths holds fixed (`make`), and its deals and rates, memoised."""

    cluster: Cluster                 # with the kernel's rates
    cfg: ModelConfig
    work: Workload
    world: int
    nodes: int
    dtype: str = "bfloat16"
    kernel: str = DEFAULT_KERNEL
    kernel_source: str = ""
    mla_pass: str | None = None      # an MLA ring's pass (None: the faster at each group size)
    # a hybrid's linear layers' LASP (None: the faster of the two for each step, `lasps`)
    linear_sp: str | None = None
    _tables: dict[Split, list[Table]] = field(default_factory=dict, repr=False)
    _rates: dict[tuple, SizeRates] = field(default_factory=dict, repr=False)
    _memo: dict[tuple, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def make(cls: type[_C], cluster: Cluster, model: str | ModelConfig, work: Workload,
             world: int, nodes: int = 1, *, dtype: str = "bfloat16",
             kernel: str = DEFAULT_KERNEL) -> _C:
        cfg = model if isinstance(model, ModelConfig) else load(model)
        # a model's own windows are planned at one length (`search`), not yet under --lengths
        require("sliding" not in cfg.layer_types or cfg.window >= work.longest, "lengths",
                work.spec, f"a plan of lengths prices every layer's attention alike: the model's "
                f"sliding-window layers (window {cfg.window}) are planned at one length "
                "(without --lengths)")
        block_params(cfg)  # a layer kind or weight the planner does not price: one line
        c, source = with_kernel(cluster, kernel, cfg.head_dim, dtype)
        return cls(c, cfg, work, world, nodes, dtype, kernel, source)

    @property
    def model_params(self) -> dict[str, int]:
        """{"total", "active"} parameters of the model planned (`--json`'s `model_params`)."""
        return model_params(self.cfg)

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

    def dealt(self, split: Split, tables: list[Table]) -> None:
        """Holds `tables` as the deals of `split` (a trial's own, as it ran)."""
        self._tables[split] = tables

    def lasp(self, linear_sp: str | None = None) -> str:
        """The LASP a step's linear layers run: `linear_sp`, else the plan's (a trial's), else
        LASP-2 (the runner's default)."""
        return linear_sp or self.linear_sp or LASP_MODES[0]

    def lasps(self, by_size: dict[int, tuple[str, dict]]) -> tuple[str, ...]:
        """The LASPs a step of `by_size` is priced under: both for a hybrid on groups of more than
        one rank (the search keeps the faster: the runner runs one a step), else one (`lasp`: the
        plan's own, a trial's, or LASP-2)."""
        if self.linear_sp or max(by_size) == 1 or "linear" not in self.cfg.layer_types:
            return (self.lasp(),)
        return LASP_MODES

    def rates(self, d: int, name: str, options: dict[str, Any], layout: str,
              linear_sp: str | None = None) -> SizeRates:
        """`lengths.size_rates` of a configuration on d ranks, a hybrid's linear layers under
        `lasp(linear_sp)` (memoised)."""
        mode = self.lasp(linear_sp)
        key = (d, name, tuple(sorted(options.items())), layout, self.mla_pass, mode)
        got = self._rates.get(key)
        if got is None:
            got = self._rates[key] = size_rates(
                self.cluster, self.cfg, self.dtype, d, self.work.capacity, name, options, layout,
                world=self.world, nodes=self.nodes, window=self.work.window,
                mla_pass=self.mla_pass, linear_sp=mode)
        return got

    def shape(self, d: int) -> AttnShape:
        return AttnShape(1, d * self.work.capacity, self.cfg.heads, self.cfg.kv_heads,
                         self.cfg.head_dim, DTYPE_BYTES[self.dtype])

    def issue(self, d: int, name: str, options: dict[str, Any], layout: str, checkpoint: str,
              fused_head: bool = False, linear_sp: str | None = None) -> tuple[float, float]:
        """(host issue seconds of a micro-batch of one document on d ranks, each further
        document's) under `checkpoint`, a hybrid's linear layers under `lasp(linear_sp)`
        (`lengths.issue_s`, memoised)."""
        mode = self.lasp(linear_sp)
        key = ("issue", d, name, tuple(sorted(options.items())), layout, checkpoint, fused_head,
               mode)
        if key not in self._memo:
            def at(docs: int, lay: str) -> float:
                return issue_s(self.cluster, self.cfg, d, name, options, lay, self.world,
                               checkpoint=checkpoint, kernel=self.kernel, docs=docs,
                               fused_head=fused_head, linear_sp=mode)

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

    def traffic(self, policy: Policy, train: TrainPolicy) -> Traffic:
        """FSDP's, zero1's or the gradient reduction's traffic a step under `policy`
        (`fsdp.traffic`, memoised by states and master dtype)."""
        key = ("traffic", policy.states, train.master_dtype)
        if key not in self._memo:
            self._memo[key] = traffic(self.setup.net, self.cfg, self.dtype, self.world, 1,
                                      policy, train)
        return self._memo[key]

    @cached_property
    def token_rates(self) -> tuple[float, float, float, float]:
        """(GEMMs, MLP GEMMs, element-wise, head) forward seconds a token, one layer (the head
        once), at a micro-batch of capacity tokens a rank."""
        cap = self.work.capacity
        return tuple(x / cap for x in layer_seconds(self.cluster, self.cfg, self.dtype, cap,
                                                    self.world))  # type: ignore[return-value]

    def recompute(self, p: Policy) -> tuple[float, bool]:
        """(the layer seconds a token that `p`'s checkpoint recomputes, whether it is full)."""
        mode, frac = split_checkpoint(p.checkpoint)
        share = {"none": 0.0, "full": 1.0, "sc++": 1.0}.get(mode, frac)
        g, mlp, ew, _ = self.token_rates
        return share * (g + ew) + (1.0 - share) * mlp * p.tiled, mode == "full"

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
