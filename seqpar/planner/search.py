"""Which configuration trains this model fastest on this cluster: the DP x SP splits of the ranks,
every attention algorithm with its options and layout, and every training policy, ranked by tokens
per GPU per second (`--scope cluster`; `--scope model` is one SP group: DP = 1).

A split puts SP ranks within one node or over whole nodes (rank r = dp index x SP + sp index) and
needs whole micro-batches: tokens per step = N x batch x DP x micro-steps. Per split the search
predicts each attention configuration once, then every policy on it (arithmetic), so it stays
fast at thousands of ranks, and prunes what cannot win:
- an attention configuration whose most frugal policy does not fit is not timed (it is counted);
- one that another beats or equals on everything a step depends on (its time forward and
  backward, its link time, its memory at the peak and what it keeps for backward, its
  communicators) is dominated: no policy can make it win. Equal ones are kept together as
  `alternatives` of one (a layout or an option that changes nothing at this shape).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from seqpar.errors import ConfigError, require
from seqpar.planner import ep as ep_mod
from seqpar.planner import memory, pins
from seqpar.planner.api import Prediction, attention_peak
from seqpar.planner.bound import Frontier, ceiling, exact
from seqpar.planner.clusters import Cluster
from seqpar.planner.dominance import metrics, pareto
from seqpar.planner.gcpause import gc_paused
from seqpar.planner.kernel import same_deal
from seqpar.planner.policy import (
    OFFLOAD_SETS,
    Filters,
    Policy,
    seq_attn_runs,
    space,
    split_checkpoint,
)
from seqpar.planner.rates import DEFAULT_KERNEL, with_kernel
from seqpar.planner.step import Setup, Step, step
from seqpar.planner.why import why_slower  # noqa: F401  (cli/plan.py's)
from seqpar.rules import algorithms, masks
from seqpar.rules.flops import block_params
from seqpar.rules.grids import ranks_per_node_of
from seqpar.rules.layouts import LAYOUTS
from seqpar.rules.linear import check_lasp
from seqpar.rules.memory import OFFLOADS
from seqpar.rules.model import ModelConfig, load


@dataclass
class Result:
    setup: Setup
    ranked: list[Step]                     # fitting first, by TGS; then the unfit, by peak
    splits: list[tuple[int, int, int]]     # (dp, sp, micro-batches) searched
    searched: int = 0                      # attention configurations x policies considered
    dominated: int = 0                     # attention configurations pruned as dominated
    too_big: int = 0                       # attention configurations that fit under no policy
    bounded: int = 0                       # configurations not timed: they cannot reach the top
    closest: tuple[int, str] | None = None  # the least peak seen when nothing fits
    alternatives: dict[int, list[tuple[dict[str, Any], str]]] = field(default_factory=dict)

    @property
    def fitting(self) -> list[Step]:
        return [s for s in self.ranked if s.fits]

    @property
    def model_params(self) -> dict[str, int]:
        """{"total", "active"} parameters of the model planned (`--json`'s `model_params`)."""
        return self.setup.model_params


def splits(setup: Setup, filters: Filters = Filters()) -> list[tuple[int, int, int]]:
    """(dp, sp, micro-batches) of every split the filters leave."""
    out = []
    per_node = setup.per_node
    for sp in range(1, setup.world + 1):
        if setup.world % sp or not (per_node % sp == 0 or sp % per_node == 0):
            continue
        dp = setup.world // sp
        if (filters.sp and sp != filters.sp) or (filters.dp and dp != filters.dp):
            continue
        m = setup.micro_batches(dp)
        if m:
            out.append((dp, sp, m))
    return out


def attention_space(sp: int, filters: Filters) -> list[tuple[str, dict[str, Any]]]:
    """(algorithm, options) of every configuration on sp ranks the filters and pins leave."""
    names = [filters.algorithm] if filters.algorithm else list(algorithms.REGISTRY)
    return pins.space([n for n in names if (n == "local") == (sp == 1)
                       and n in algorithms.REGISTRY], sp, filters.options)


def frugal(policies: Sequence[Policy]) -> Policy:
    """A space's policy of the least memory (full checkpoint, fused head, most offload, tiled)."""
    def cost(p: Policy) -> tuple:
        ck = {"full": 0, "sc++": 2}.get(p.checkpoint, 1 if p.checkpoint.startswith("seq-attn")
                                        else 3 if "seq:" in p.checkpoint else 4)
        return (ck, not p.fused_head, -len(p.offload), not p.tiled)

    return min(policies, key=cost)


def check_counts(**counts: int) -> None:
    """Every count a plan takes is a positive integer (a sweep field's rule)."""
    for name, value in counts.items():
        require(isinstance(value, int) and not isinstance(value, bool) and value >= 1,
                name.replace("_", "-"), value, "must be a positive integer")


def make_setup(cluster: Cluster, model: str | ModelConfig, seq_len: int,
               tokens_per_step: int | None, world: int, nodes: int, *,
               kernel: str = DEFAULT_KERNEL, dtype: str = "bfloat16", batch: int = 1,
               causal: bool = True, mask: str | None = None, ep: int | None = None,
               routing_skew: float = ep_mod.ROUTING_SKEW, linear_sp: str = "auto") -> Setup:
    """A search's fixed part, validated: the cluster with the kernel's rates, the model (a name or
    path for `ModelConfig.load`), the step's tokens (None: one sequence per DP replica) over
    world ranks on nodes nodes, under a plain causal (or full) relation or any `mask` (a
    `masks.parse` spec of seq_len tokens); `ep` pinned (None: searched), `routing_skew`: `ep`'s;
    `linear_sp` a hybrid's linear layers (auto: the faster of LASP-2 and LASP-1 at each SP size)."""
    check_counts(seq_len=seq_len, world=world, nodes=nodes, batch=batch,
                 **({} if tokens_per_step is None else {"tokens_per_step": tokens_per_step}))
    ranks_per_node_of(world, nodes, None)  # nodes divide the world: the one rule
    require(tokens_per_step is None or tokens_per_step % (seq_len * batch) == 0,
            "tokens-per-step", tokens_per_step,
            f"must be a multiple of seq-len x batch ({seq_len * batch}): whole sequences")
    cfg = model if isinstance(model, ModelConfig) else load(model)
    c, source = with_kernel(cluster, kernel, cfg.head_dim, dtype)
    if ep is not None:
        ep_mod.check(cfg, ep, world)
    require(routing_skew >= 1, "routing-skew", routing_skew, "must be at least 1 (the busiest EP "
            "rank's routed pairs over the mean)")
    why = memory.expert_parallelism(cfg, dtype, Policy().train(dtype), world, c.memory_gb * 1e9,
                                    c.host_link_gb_per_s is not None) if ep == 1 else None
    require(why is None, "ep", 1, why or "")
    m = None if mask is None else masks.parse(mask, seq_len)
    if m is not None and m.plain:
        causal, m = m.relation.causal, None
    setup = Setup(c, cfg, seq_len, tokens_per_step, world, nodes, dtype, batch, kernel, source,
                  m.causal if m is not None else causal, m, float(routing_skew), linear_sp)
    _ = setup.sliding_mask, block_params(cfg)  # what the step cannot price: one line, now
    return setup


@gc_paused()
def search(setup: Setup, filters: Filters = Filters(), *, offload_sets: Sequence[tuple[str, ...]]
           = OFFLOAD_SETS, tiled: Sequence[bool] = (False, True), keep: int | None = None,
           attention: Sequence[tuple[str, dict[str, Any]]] | None = None,
           layouts: Sequence[str] | None = None, every: bool = False) -> Result:
    """Every configuration the filters leave, predicted and ranked (fitting by TGS, then unfit).
    With `keep`, only what can still reach the best `keep` fitting ones is timed (branch and
    bound: no policy runs an attention configuration faster than its bound, `_bound`).
    `attention` replaces each split's (algorithm, options) space; `layouts` the layouts. `every`:
    the dominated attention configurations too, each once under its dominator's best policy and
    marked (`Step.dominated_by`), and those that fit under no policy, under their most frugal."""
    result = Result(setup, [], splits(setup, filters))
    budget = setup.cluster.memory_gb * 1e9
    # causal: contiguous moves the same bytes and holds the same memory as the balanced layouts,
    # with the busiest rank doing ~2x their work: never faster, so not timed unless asked for
    if filters.layout:
        layouts = [filters.layout]
    elif layouts is None and "linear" in setup.cfg.layer_types:
        layouts = ["contiguous"]  # LASP passes one state a rank (`rules.linear.check_lasp`)
    elif layouts is None:
        layouts = [lay for lay in LAYOUTS if not (setup.causal and setup.mask is None
                                                   and lay == "contiguous")]
    offloadable = setup.cluster.host_link_gb_per_s is not None
    candidates: list[tuple[float, tuple[int, int, Prediction, list, list[Policy]]]] = []
    extra: list[tuple[int, int, Prediction, Prediction | None, list[Policy]]] = []
    eps = ep_mod.degrees(setup.cfg, setup.world, setup.per_node)
    dealt: dict[tuple[str, str, int], bool] = {}  # `same_deal`, asked once a search
    for dp, sp, _ in result.splits:
        every_policy = [p for p in space(filters, dp, offload_sets, tiled, sp, setup.per_node,
                                         eps=eps) if (offloadable or not p.offload)
                        and ep_mod.allowed(p, setup.cfg, setup.world)]
        if not every_policy:
            continue
        usable = _Usable(setup, sp, every_policy)
        probed = _Probes(setup, dp, sp)
        predictions: list[Prediction] = []
        for name, options in (attention if attention is not None else attention_space(sp, filters)):
            timed: dict[str, Prediction] = {}  # this configuration's, by layout
            config = (name, tuple(sorted(options.items())))  # what its memory depends on
            peak = None  # the attention's own, whatever the layout
            for layout in layouts:
                try:
                    algorithms.check(name, setup.shape, sp, layout, setup.causal, **options)
                    check_lasp(setup.cfg, layout, sp)
                except ConfigError:
                    continue
                policies, thin = usable.of(name, layout)
                if not policies:
                    continue
                if peak is None:
                    peak = attention_peak(name, setup.shape, sp, options, setup.sp_nodes(sp))
                probes = probed.upto(config, options, peak, thin, budget)
                if probes[-1] > budget:  # no policy fits: every one probed
                    probe = min(probes)
                    result.too_big += 1
                    if result.closest is None or probe < result.closest[0]:
                        least = min(t.label() for t, q in zip(thin, probes, strict=True)
                                    if q == probe)
                        result.closest = (probe, f"dp={dp} sp={sp} {name} {least}")
                    if every:
                        least_policy = min(thin, key=lambda t: _probe(setup, dp, sp, name, options,
                                                                      peak, t))
                        extra.append((dp, sp, setup.attention(sp, name, dict(options), layout),
                                      None, [least_policy]))
                    continue
                # a layout that deals as one already timed predicts alike (no mask: `same_deal`)
                twin = next((p for lay, p in timed.items() if setup.mask is None
                             and _dealt_alike(dealt, lay, layout, sp)), None)
                timed[layout] = (replace(twin, layout=layout) if twin is not None
                                 else setup.attention(sp, name, dict(options), layout))
                predictions.append(timed[layout])
                latent = setup.latent(sp, timed[layout])  # MLA: the latent's ring beside K,V's
                if latent is not None:
                    predictions.append(latent)
        kept, same, beaten = pareto([metrics(setup, sp, p, usable.prefixes)
                                     for p in predictions])
        result.dominated += len(beaten)
        for i in kept:
            alternatives = [(predictions[j].options, predictions[j].layout) for j in same[i]]
            policies = _runnable(setup, predictions[i],
                                 usable.of(predictions[i].algorithm, predictions[i].layout)[0])
            if not policies:
                continue
            top = ceiling(setup, dp, sp, predictions[i], policies) if keep else 0.0
            candidates.append((top, (dp, sp, predictions[i], alternatives, policies)))
        if every:
            extra += [(dp, sp, predictions[i], predictions[j],
                       usable.of(predictions[i].algorithm, predictions[i].layout)[0])
                      for i, j in beaten.items()]
    steps: list[Step] = []
    best: list[float] = []  # TGS of the fitting steps, kept sorted descending (the top `keep`)
    best_of: dict[int, Step] = {}  # per kept prediction, its best step (dominated ones borrow it)
    early: dict[tuple[int, Policy], Step] = {}  # steps the exact bounds took, by (id(p), policy)
    frontier = Frontier(candidates, (lambda c: exact(setup, c[0], c[1], c[2], c[4], early))
                        if keep else None)
    while (got := frontier.pop()) is not None:  # by bound, highest first
        bound, (dp, sp, p, alternatives, policies) = got
        if keep and len(best) >= keep and bound < best[keep - 1]:  # nor can any after it
            result.bounded += sum(len(c[4]) for c in [got[1], *frontier.rest()])
            break
        for policy in policies:
            result.searched += 1
            s = early.pop((id(p), policy), None) or step(setup, dp, sp, p, policy)
            if alternatives:
                result.alternatives[id(s)] = alternatives
            steps.append(s)
            if _better(s, best_of.get(id(p))):
                best_of[id(p)] = s
            if keep and s.fits:
                best.append(s.tgs)
                best.sort(reverse=True)
                del best[keep:]
    for dp, sp, p, by, policies in extra:
        pick = best_of.get(id(by)) if by is not None else None
        policy = pick.policy if pick is not None and pick.policy in policies else policies[0]
        s = step(setup, dp, sp, p, policy)
        s.dominated_by = None if by is None else {"algorithm": by.algorithm,
                                                  "options": by.options, "layout": by.layout}
        steps.append(s)
    steps.sort(key=lambda s: (not s.fits, -s.tgs if s.fits else s.peak_mem_bytes))
    result.ranked = steps
    return result


def _runnable(setup: Setup, p: Prediction, policies: list[Policy]) -> list[Policy]:
    """The policies `p` runs under: MLA's latent ring not with seq-attn (`check_mla_pass`)."""
    if getattr(p, "mla_pass", "kv") == "kv":
        return policies
    return [t for t in policies if not t.checkpoint.startswith("seq-attn")]


def _dealt_alike(memo: dict[tuple[str, str, int], bool], a: str, b: str, world: int) -> bool:
    """`same_deal(a, b, world)`, memoised in `memo`."""
    got = memo.get((a, b, world))
    if got is None:
        got = memo[(a, b, world)] = same_deal(a, b, world)
    return got


def _better(s: Step, than: Step | None) -> bool:
    """Whether s beats `than` as a configuration's best step: fitting, then TGS, then memory."""
    if than is None:
        return True
    return (s.fits, s.tgs if s.fits else -s.peak_mem_bytes) > \
        (than.fits, than.tgs if than.fits else -than.peak_mem_bytes)


class _Usable:
    """The policies of a split that can train each attention configuration (seq-attn's rules,
    `Policy.runs`) and their most frugal per states choice and EP, computed once per set of
    seq-attn fractions an (algorithm, layout) allows."""

    def __init__(self, setup: Setup, sp: int, policies: list[Policy]):
        self.setup, self.sp, self.policies = setup, sp, policies
        self.prefixes = sorted({split_checkpoint(p.checkpoint)[1] for p in policies
                                if p.checkpoint.startswith("seq-attn")})
        self._sets: dict[tuple, tuple[list[Policy], list[Policy]]] = {}
        self._allowed: dict[tuple[str, str], tuple[float, ...]] = {}

    def of(self, name: str, layout: str) -> tuple[list[Policy], list[Policy]]:
        s = self.setup
        allowed = self._allowed.get((name, layout))
        if allowed is None:
            allowed = self._allowed[(name, layout)] = tuple(
                f for f in self.prefixes
                if seq_attn_runs(f, name, layout, self.sp, s.seq_len, s.causal))
        got = self._sets.get(allowed)
        if got is None:
            mine = [p for p in self.policies if not p.checkpoint.startswith("seq-attn")
                    or split_checkpoint(p.checkpoint)[1] in allowed]
            thin = [frugal([p for p in mine if (p.states, p.ep) == key])  # EP: not all offload
                    for key in dict.fromkeys((p.states, p.ep) for p in mine)]
            got = self._sets[allowed] = (mine, thin)
        return got


class _Probes:
    """`_probe` of a split, memoised: a configuration's layouts hold the same memory."""

    def __init__(self, setup: Setup, dp: int, sp: int):
        self.setup, self.dp, self.sp = setup, dp, sp
        self._got: dict[tuple, int] = {}

    def __call__(self, config: tuple[str, tuple], options: dict[str, Any], peak: int,
                 policy: Policy) -> int:
        """`_probe` of the configuration `config` names: (algorithm, sorted options)."""
        key = (config, peak, policy)
        got = self._got.get(key)
        if got is None:
            got = self._got[key] = _probe(self.setup, self.dp, self.sp, config[0], options, peak,
                                          policy)
        return got

    def upto(self, config: tuple[str, tuple], options: dict[str, Any], peak: int,
             policies: Sequence[Policy], budget: float) -> list[int]:
        """The probes of `policies` in order, up to the first that fits in `budget` (all of
        them when none does)."""
        out = []
        for policy in policies:
            out.append(self(config, options, peak, policy))
            if out[-1] <= budget:
                break
        return out


def _probe(setup: Setup, dp: int, sp: int, name: str, options: dict[str, Any], peak: int,
           policy: Policy) -> int:
    """The peak memory of a configuration under `policy`, before any timing (memory needs only
    the attention's own peak)."""
    return memory.step_memory(name, setup.shape, sp, options, setup.cfg,
                              policy.train(setup.dtype), peak, setup.dtype, dp=dp,
                              shards=policy.shards(dp, sp, setup.per_node),
                              comms=memory.communicators(name, sp, dp, policy.states,
                                                         setup.per_node, policy.ep)
                              if setup.cluster.cores is None else 0, ep=policy.ep,
                              skew=setup.routing_skew)["peak"]


def best_per_split(result: Result) -> list[Step]:
    """The best fitting configuration of each (dp, sp) split, best first."""
    seen: dict[tuple[int, int], Step] = {}
    for s in result.fitting:
        seen.setdefault((s.dp, s.sp), s)
    return list(seen.values())


def offload_names(text: str) -> tuple[str, ...]:
    """`--offload` as given: comma-separated names drawn from OFFLOADS, or `none`."""
    if text.strip() in ("", "none", "[]"):
        return ()
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    bad = [n for n in names if n not in OFFLOADS]
    if bad:
        raise ConfigError("offload", text, f"must be none or a comma-separated list drawn from "
                          f"{', '.join(OFFLOADS)}")
    return names


def with_alternatives(result: Result, s: Step) -> list[Step]:
    """`s` and the configurations equal to it (other layouts or options with its prediction)."""
    return [s] + [replace(s, attention=replace(s.attention, options=o, layout=lay))
                  for o, lay in result.alternatives.get(id(s), [])]
