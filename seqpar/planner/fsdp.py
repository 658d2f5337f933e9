"""A training step's traffic besides the attention's: FSDP's gathers and reduce-scatters of a block
and of the root (embedding, head, final norm), the data-parallel reduction of what FSDP did not
reduce, over the groups each states choice names (`Policy.states`), zero1's broadcast of the
updated parameters from the ranks that own them, after the optimizer, and dist-opt's all-gather of
every parameter and reduce-scatter of every gradient, once a step each, outside the micro-batches
(as the runner does them, exposed). Each is a `net.Cost`: its time
and how long it keeps each link class busy, which the step adds to the attention's own busy time
on the same links (`step.step`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from seqpar.planner import ep as ep_mod
from seqpar.planner.net import Cost, Net
from seqpar.planner.policy import REPLICATED, Policy
from seqpar.rules.counts import root_numel
from seqpar.rules.memory import ELEM, TrainPolicy
from seqpar.rules.model import ModelConfig, block_numel

NONE = Cost(0.0)


@dataclass(frozen=True)
class Traffic:
    gather: Cost         # one block's all-gather
    scatter: Cost        # one block's reduce-scatter
    root: float          # the root's gather + reduce-scatter, once a micro-step
    reduce: Cost         # one block's data-parallel all-reduce (last micro-step)
    reduce_root: float
    # zero1: every updated parameter broadcast from its owner after AdamW, once a step (torch's
    # ZeroRedundancyOptimizer posts them all at once: an all-gather of the parameters' bytes);
    # dist-opt: the step's all-gather of the parameters and reduce-scatter of the gradients
    update: Cost = NONE

    def busy(self, link: str, last: bool = False) -> float:
        """Seconds a block's traffic keeps `link` busy: two gathers (forward, and again for
        backward: reshard after forward), one reduce-scatter, and in the last micro-step the
        data-parallel reduction."""
        out = 2 * self.gather.busy(link) + self.scatter.busy(link)
        return out + (self.reduce.busy(link) if last else 0.0)


def groups(per_node: int, dp: int, sp: int, over: str) -> list[list[int]]:
    """Rank r = dp index x sp + sp index: `all`, the `sp` groups, the `dp` groups, each `node`'s
    ranks, or the ranks of one local index across `nodes` (per_node ranks a node)."""
    world, per = dp * sp, min(per_node, dp * sp)
    if over == "all":
        return [list(range(world))]
    if over == "sp":
        return [[d * sp + i for i in range(sp)] for d in range(dp)]
    if over == "node":
        return [list(range(n, n + per)) for n in range(0, world, per)]
    if over == "nodes":
        return [list(range(j, world, per)) for j in range(per)]
    return [[d * sp + i for d in range(dp)] for i in range(sp)]


def traffic(net: Net, cfg: ModelConfig, dtype: str, dp: int, sp: int, policy: Policy,
            train: TrainPolicy, block: int | None = None, routed: int = 0) -> Traffic:
    """The traffic of a DP x SP split of `net`'s ranks (`net.ranks_per_node` a node), a block of
    `block` parameters (default: the mean block; a model whose layers differ asks per block).
    Under expert parallelism (`policy.ep`) the block's `routed` experts' parameters are not the
    whole group's: a rank's EP share (routed / ep) is sharded and reduced over the ranks that
    hold the same experts (`ep.expert_groups`), the rest of the block as without EP."""
    if policy.ep > 1 and routed:
        return _with_experts(net, cfg, dtype, dp, sp, policy, train, block or block_numel(cfg),
                             routed)
    e, stored = ELEM[dtype], ELEM[train.master_dtype or dtype]
    block, root = block or block_numel(cfg), root_numel(cfg)
    per_node = net.ranks_per_node
    shards = policy.shards(dp, sp, per_node)

    def coll(over: str, size: int, numel: int, elem: int, factor: float) -> Cost:
        if size < 2:
            return NONE
        nbytes = int(factor * (size - 1) / size * numel * elem)
        return net.collective(groups(per_node, dp, sp, over), nbytes)

    if policy.states == "dist-opt":  # compute-dtype parameters in, master-dtype gradients out
        whole = cfg.params()
        return Traffic(NONE, NONE, 0.0, NONE, 0.0, _plus(coll("all", dp * sp, whole, e, 1),
                                                         coll("all", dp * sp, whole, stored, 1)))
    over = {"dp_sp": "all", "sp": "sp", "node": "node"}.get(policy.states, "all")
    sharded = policy.states not in REPLICATED  # FSDP's gathers and reduce-scatters
    gather = coll(over, shards, block, e, 1) if sharded else NONE
    scatter = coll(over, shards, block, stored, 1) if sharded else NONE
    root_s = (coll(over, shards, root, e, 1).seconds + coll(over, shards, root, stored, 1).seconds
              if sharded else 0.0)
    update = NONE
    if not sharded:
        reduce = coll("all", dp * sp, block, stored, 2)
        reduce_root = coll("all", dp * sp, root, stored, 2)
        if policy.states == "zero1":
            update = coll("all", dp * sp, cfg.params(), stored, 1)
    elif policy.states == "sp":
        reduce = coll("dp", dp, block // sp, stored, 2)
        reduce_root = coll("dp", dp, root // sp, stored, 2)
    elif policy.states == "node":
        nodes = dp * sp // shards
        reduce = coll("nodes", nodes, block // shards, stored, 2)
        reduce_root = coll("nodes", nodes, root // shards, stored, 2)
    else:
        reduce = reduce_root = NONE
    return Traffic(gather, scatter, root_s, reduce, reduce_root.seconds, update)


_EXPERT_GROUPS: dict[tuple[int, int], list[list[int]]] = {}  # one list each: `Net`'s memo key


def _with_experts(net: Net, cfg: ModelConfig, dtype: str, dp: int, sp: int, policy: Policy,
                  train: TrainPolicy, block: int, routed: int) -> Traffic:
    """`traffic` of a block whose routed experts are spread over EP groups: the rest of the block
    over every rank, the rank's experts (routed / ep) over its expert group of world / ep ranks:
    FSDP's gathers and reduce-scatters (dp_sp), or the gradients' all-reduce (replicated)."""
    rest = traffic(net, cfg, dtype, dp, sp, Policy(policy.states), train, block - routed)
    world = dp * sp
    size = world // policy.ep
    if size < 2:
        return rest
    key = (world, policy.ep)
    if key not in _EXPERT_GROUPS:
        _EXPERT_GROUPS[key] = ep_mod.expert_groups(world, policy.ep)
    over = _EXPERT_GROUPS[key]
    share = routed // policy.ep
    e, stored = ELEM[dtype], ELEM[train.master_dtype or dtype]

    def coll(elem: int, factor: float) -> Cost:
        return net.collective(over, int(factor * (size - 1) / size * share * elem))

    if policy.states == "replicated":
        return replace(rest, reduce=_plus(rest.reduce, coll(stored, 2)))
    return replace(rest, gather=_plus(rest.gather, coll(e, 1)),
                   scatter=_plus(rest.scatter, coll(stored, 1)))


def _plus(a: Cost, b: Cost) -> Cost:
    """Two collectives one after the other on the same ranks."""
    return Cost(a.seconds + b.seconds, a.intra + b.intra, a.inter + b.inter, a.intra_s + b.intra_s,
                a.inter_s + b.inter_s)
