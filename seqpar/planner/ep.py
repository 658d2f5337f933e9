"""Expert parallelism priced: a mixture of experts' routed experts spread over EP groups of `ep`
consecutive ranks of the DP x SP ranks (rank r = dp index x SP + sp index: SP-inner, so an EP group
lies within a node when ep divides the GPUs a node, over whole nodes when a node's GPUs divide it).

Per MoE block and micro-step each rank sends every (token, expert) pair of its shard whose expert
another member holds (dispatch) and takes the expert's output back (combine); backward runs the
two again with the gradients, and a recompute that re-runs the feed-forward re-runs them too.
Each dispatch is preceded by the exchange of its sizes (every rank's count an expert: a small
all-to-all, latency). Routing is uniform by default: a pair's expert is on another member with
probability (ep - 1)/ep, each member gets T·k/ep pairs of each. `ROUTING_SKEW` (the busiest
member's pairs over the mean, `--routing-skew`) scales what the busiest member receives and
computes: every member waits for it.
Overlap: none (`EP_OVERLAP`): dispatch, the experts and combine each wait on the one before, so
each all-to-all lies on the block's compute path; it also keeps its links busy beside FSDP's
traffic and the attention's (`step`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from seqpar.errors import require
from seqpar.planner import host
from seqpar.planner.clusters import Cluster
from seqpar.planner.net import Cost, Net
from seqpar.rules.groups import EP_CHECKPOINTS, edp_groups, ep_groups
from seqpar.rules.model import ModelConfig

ROUTING_SKEW = 1.0  # uniform routing: the busiest EP member gets the mean of the routed pairs
EP_OVERLAP = 0.0    # of an all-to-all hidden behind compute: none (each waits on the last)
FORWARD = 2         # dispatch and combine a block's forward; backward the same again
# what the runner trains with EP (`model.ep.check`): `EP_CHECKPOINTS`, activations the only
# offload, no tiled MLP; FSDP needs E / world experts a rank


def degrees(cfg: ModelConfig, world: int, per_node: int) -> tuple[int, ...]:
    """The EP degrees a search tries: 1, and for a mixture of experts every ep that divides the
    experts and the ranks and places its groups within a node or over whole nodes."""
    if not cfg.experts:
        return (1,)
    return tuple(e for e in range(1, world + 1) if world % e == 0 and cfg.experts % e == 0
                 and (per_node % e == 0 or e % per_node == 0))


def check(cfg: ModelConfig, ep: int, world: int) -> None:
    """One line for an EP degree the model or the ranks cannot take."""
    require(isinstance(ep, int) and not isinstance(ep, bool) and ep >= 1, "ep", ep,
            "must be a positive integer")
    if ep == 1:
        return
    require(cfg.experts > 0, "ep", ep, f"needs a mixture of experts: {cfg.family} here has no "
            "routed experts (ep 1)")
    require(cfg.experts % ep == 0, "ep", ep, f"must divide the model's routed experts "
            f"({cfg.experts}): each EP rank holds as many")
    require(world % ep == 0, "ep", ep, f"must divide the ranks (DP x SP = {world}): EP groups "
            "are ep consecutive ranks")


def allowed(policy: Any, cfg: ModelConfig, world: int) -> bool:
    """Whether the runner trains `policy` (a `Policy`) with its EP (`EP_CHECKPOINTS`)."""
    return policy.ep == 1 or (policy.checkpoint in EP_CHECKPOINTS and not policy.tiled
                              and set(policy.offload) <= {"activations"}
                              and (policy.states != "dp_sp" or cfg.experts % world == 0))


def check_filters(filters: Any) -> None:
    """One line for a pin the runner does not train beside a pinned EP over 1 (`Filters`)."""
    f = filters
    if not f.ep or f.ep == 1:
        return
    require(f.checkpoint is None or f.checkpoint in EP_CHECKPOINTS, "checkpoint", f.checkpoint,
            f"with ep {f.ep} must be one of {', '.join(EP_CHECKPOINTS)} (the sequence modes "
            "split a rank's tokens unevenly across the EP group)")
    require(f.tiled is not True, "tiled", True, f"not with ep {f.ep}: a tile would be an "
            "all-to-all a tile")
    require(f.offload is None or set(f.offload) <= {"activations"}, "offload",
            ",".join(f.offload or ()), f"with ep {f.ep} may only be activations (the experts' "
            "states are held outside FSDP2)")


# the EP groups (ep consecutive ranks each) and the ranks that hold the same experts (what shards
# their states under FSDP and reduces their gradients): the runner's placement rule
groups, expert_groups = ep_groups, edp_groups


def pairs_sent(cfg: ModelConfig, tokens: float, ep: int) -> float:
    """(token, expert) pairs of `tokens` tokens one rank sends to other members in a dispatch,
    uniform routing: k a token, (ep - 1)/ep of them elsewhere."""
    return tokens * cfg.experts_per_tok * (ep - 1) / ep


def a2a_bytes(cfg: ModelConfig, tokens: float, ep: int, elem: int) -> int:
    """Bytes one rank sends in one all-to-all (dispatch or combine, forward or backward): a
    hidden-wide vector of `elem` bytes for each pair it sends."""
    return round(pairs_sent(cfg, tokens, ep) * cfg.hidden * elem)


@dataclass(frozen=True)
class A2A:
    """One all-to-all of a block: its seconds on the compute path and the links it keeps busy."""

    cost: Cost
    seconds: float        # exposed: the link time, or a host transport's own copies and sends
    counts: float = 0.0   # the sizes' exchange before a dispatch (forward only)

    def busy(self, link: str) -> float:
        return self.cost.busy(link)


NONE = A2A(Cost(0.0), 0.0)


def all_to_all(net: Net, cluster: Cluster, cfg: ModelConfig, tokens: float, ep: int, elem: int,
               skew: float, ep_groups: list[list[int]]) -> A2A:
    """One all-to-all of `tokens` tokens' pairs over the EP groups, the busiest member's share
    (`skew` x the mean); on a host whose ranks share its cores (gloo) also the rank's own packing
    and sends, as the attention's collectives are priced (`predict`), and a collective's issue
    and wait there (`host.waits`: a step's other collectives are counted by `rules.ops`)."""
    if ep < 2:
        return NONE
    issue = 0.0
    if cluster.cores is not None:
        issue = cluster.dispatch_us * 1e-6 + host.waits(cluster, net.world)[1]

    def seconds(nbytes: int) -> tuple[Cost, float]:
        cost = net.collective(ep_groups, nbytes)
        copies = 0.0
        if cluster.copy_gb_per_s:  # a host transport packs and unpacks its whole buffer
            one = cluster.copy_seconds(2 * nbytes * ep / (ep - 1))
            copies = cluster.host_seconds(one, one * net.world, net.world)
        transport = cluster.transport_seconds(2 * nbytes, 2 * (ep - 1))
        return cost, issue + copies + max(cost.seconds, transport)

    cost, took = seconds(round(skew * a2a_bytes(cfg, tokens, ep, elem)))
    return A2A(cost, took, seconds(cfg.experts * 8 * (ep - 1) // ep)[1])  # int64 counts


def runs(share: float) -> float:
    """All-to-alls a block runs in a micro-step: forward's two, backward's two, and the forward's
    again for the share of the block a checkpoint mode recomputes (each forward's dispatch after
    its sizes' exchange: `A2A.counts`, (1 + share) of them)."""
    return (2 + share) * FORWARD
