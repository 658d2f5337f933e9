"""Expert parallelism: every MoE layer's experts spread over an EP group, each token's hidden state
sent to the ranks holding its experts and the results brought back (`rules.groups`: which ranks).

    groups = algorithms.mesh.build_expert_groups(ep)          # every rank, once
    experts = ExpertParallel(groups, sharded=False, dp=1)
    out, stats = experts.ffn(h, params, cfg)                  # in place of moe.moe_ffn

Routing is `moe.route` on each rank's own tokens; the assignments, sorted by expert (so by the
rank that holds it: EP rank i holds experts [i E/ep, (i+1) E/ep)), go out in one all-to-all with
uneven splits (`dispatch`; the split sizes come first, in an all-to-all of the per-expert counts),
the rank's E/ep experts run on what arrived grouped by local expert (`moe.run_experts`), and one
more all-to-all (`combine`) brings every result back to its token, where it is weighted and
summed in token order as `moe.moe_ffn` does: in float64 the same numbers as the one-process
model. The backward of each all-to-all is the other's shape carrying the gradients. Shared
experts and the router are every rank's, as without EP. No token is dropped: a capacity factor
(dropping what overflows an expert) changes the function and is not offered.

The experts' states: each rank holds its EP index's slice of every experts_* tensor (replicated
states; the gradients summed over the EDP group, the ranks holding the same experts) or, under
FSDP, 1/(world/ep) of that slice, all-gathered over the EDP group for each forward and
reduce-scattered back in backward (`_EdpGather`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist

from seqpar.algorithms import ledger
from seqpar.algorithms.comm import Comm
from seqpar.algorithms.mesh import ExpertGroups, Mesh, build_expert_groups
from seqpar.errors import require
from seqpar.model import grads, init, moe
from seqpar.model.states import StatePolicy
from seqpar.rules.groups import EP_CHECKPOINTS, check_ep
from seqpar.rules.model import ModelConfig

Tensor = torch.Tensor
EXPERT_PREFIX = "experts_"


def exchange_counts(comm: Comm, per_expert: Tensor) -> Tensor:
    """(ep, E/ep): how many assignments each rank of the group sends to each of this rank's
    experts, from every rank's (E,) counts (the sizes of the dispatch, sent before it)."""
    ep = comm.size
    return comm.all_to_all_rows(per_expert.view(ep, -1), [1] * ep, [1] * ep, "all_to_all_counts")


class _Exchange(torch.autograd.Function):
    """One all-to-all of rows; its backward is the reverse all-to-all of the gradients (a
    dispatch's backward has the combine's shape, and the other way round)."""

    @staticmethod
    def forward(ctx, x, comm, send_rows, recv_rows):
        ctx.comm, ctx.send_rows, ctx.recv_rows = comm, send_rows, recv_rows
        ctx.ledgers = ledger.active()
        return comm.all_to_all_rows(x, send_rows, recv_rows)

    @staticmethod
    def backward(ctx, grad):
        with ledger.backward_of(ctx.ledgers):
            back = ctx.comm.all_to_all_rows(grad, ctx.recv_rows, ctx.send_rows)
        return back, None, None, None


class _Dispatch(_Exchange):
    """Each assignment's hidden state to the rank holding its expert."""


class _Combine(_Exchange):
    """Each expert's result back to the rank of its token."""


class _EdpGather(torch.autograd.Function):
    """FSDP over the EDP group: this rank's shard of its experts gathered (forward) and the
    gradient reduce-scattered, summed over the group and divided by `dp` (backward)."""

    @staticmethod
    def forward(ctx, shard, group, size, dp):
        ctx.group, ctx.size, ctx.dp = group, size, dp
        if group is None:
            return shard
        out = shard.new_empty((size * shard.shape[0], *shard.shape[1:]))
        dist.all_gather_single(out, shard.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        if ctx.group is None:
            return grad / ctx.dp if ctx.dp != 1 else grad, None, None, None
        out = grad.new_empty((grad.shape[0] // ctx.size, *grad.shape[1:]))
        dist.reduce_scatter_single(out, grad.contiguous(), group=ctx.group)
        return (out / ctx.dp if ctx.dp != 1 else out), None, None, None


class _Scaled(torch.autograd.Function):
    """Identity whose backward divides by `dp`: replicated experts' gradients are summed over
    the EDP group (DP replicas included), the model's mean over replicas wants them / dp."""

    @staticmethod
    def forward(ctx, x, dp):
        ctx.dp = dp
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad / ctx.dp, None


class ExpertParallel:
    """The EP groups and how this rank holds its experts (see the module docstring)."""

    def __init__(self, groups: ExpertGroups, sharded: bool, dp: int = 1):
        self.groups, self.sharded, self.dp = groups, sharded, dp

    @property
    def ep(self) -> int:
        return self.groups.ep

    def held(self, experts: int) -> tuple[int, int]:
        """The experts [start, stop) of `experts` whose rows this rank stores."""
        start, stop = self.groups.experts(experts)
        if not self.sharded:
            return start, stop
        per = (stop - start) // self.groups.edp_size
        return start + self.groups.edp_rank * per, start + (self.groups.edp_rank + 1) * per

    def weights(self, p: Tensor) -> Tensor:
        """This rank's experts of a stored experts_* tensor, as the forward uses them."""
        g = self.groups
        if self.sharded:
            return _EdpGather.apply(p, g.edp, g.edp_size, self.dp)
        return _Scaled.apply(p, self.dp) if self.dp != 1 else p

    def ffn(self, x: Tensor, p: Mapping[str, Tensor], cfg: ModelConfig,
            mask: Tensor | None = None) -> tuple[Tensor, moe.RouterStats]:
        """`moe.moe_ffn` of x (b, s, d) with the experts spread over the EP group; p holds this
        rank's stored expert tensors (`weights` makes them the EP slice)."""
        return moe.moe_ffn(x, p, cfg, mask, run=lambda rows, per_expert: self._exchange(
            rows, per_expert, p, cfg))

    def _exchange(self, rows: Tensor, per_expert: Tensor, p: Mapping[str, Tensor],
                  cfg: ModelConfig) -> Tensor:
        """The experts' outputs of `rows` (assignments grouped by expert, so by the rank holding
        it; per_expert (E,) counts): dispatched, run where the experts are, combined back."""
        comm, ep = self.groups.comm, self.groups.ep
        arriving = exchange_counts(comm, per_expert)    # (ep, E/ep): from rank j to my expert e
        # every split size in one read of the device (one host sync a layer)
        counts = torch.cat([per_expert.view(ep, -1), arriving]).tolist()
        send_rows, recv_rows = [sum(c) for c in counts[:ep]], [sum(c) for c in counts[ep:]]
        got = _Dispatch.apply(rows, comm, send_rows, recv_rows)
        # what arrived is by source rank, then expert: regroup by local expert (stable: source
        # order kept inside an expert), run, and put back in arrival order
        local = torch.arange(arriving.shape[1], device=rows.device).repeat(ep)
        by_expert = local.repeat_interleave(arriving.reshape(-1)).argsort(stable=True)
        mine = {n: self.weights(t) if n.startswith(EXPERT_PREFIX) else t for n, t in p.items()}
        per_local = [sum(c) for c in zip(*counts[ep:], strict=True)]  # by my local expert
        ys = moe.run_experts(got[by_expert], per_local, mine, cfg)
        ys = torch.zeros_like(ys).index_copy(0, by_expert, ys)
        return _Combine.apply(ys, comm, recv_rows, send_rows)

    def full(self, t: Tensor, experts: int) -> Tensor:
        """The whole (E, ...) tensor of this rank's stored rows `t` of an experts_* tensor (a
        parameter or its gradient): gathered over the EDP group (FSDP), then the EP group.
        Every rank of the world calls it."""
        g = self.groups
        if self.sharded and g.edp is not None:
            t = _gather(t, g.edp, g.edp_size)
        if g.comm.group is not None:
            t = _gather(t, g.comm.group, g.ep)
        assert t.shape[0] == experts
        return t


def _gather(t: Tensor, group: dist.ProcessGroup, size: int) -> Tensor:
    out = t.new_empty((size * t.shape[0], *t.shape[1:]))
    dist.all_gather_single(out, t.detach().contiguous(), group=group)
    return out


def is_expert(name: str) -> bool:
    """Whether parameter `name` is a routed-expert tensor (stacked over the experts)."""
    return name.rsplit(".", 1)[-1].startswith(EXPERT_PREFIX)


@torch.no_grad()
def init_experts(net: torch.nn.Module, seed: int, experts: ExpertParallel, total: int,
                 norm_offset: bool = False) -> None:
    """Redraw this rank's rows of every experts_* tensor as the rows [start, stop) of the whole
    (`init.draw_rows`: the values the one-process model draws), after `init.init_parameters`
    drew them as if they were the whole tensor."""
    start, stop = experts.held(total)
    for index, (name, p) in enumerate(net.named_parameters()):
        if not is_expert(name) or init.fill_value(name, norm_offset) is not None:
            continue
        per = math.prod(p.shape[1:-1])
        rows = init.draw_rows(seed, index, (total * per, p.shape[-1]), start * per, stop * per)
        p.view(-1, p.shape[-1]).copy_(rows)


def expert_params(net: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The routed experts' tensors of `net`, in parameter order."""
    return [p for n, p in net.named_parameters() if is_expert(n)]


EP_STATES = ("replicated", "fsdp")


def check(ep: int, cfg: ModelConfig, world: int, states: str, offload: Sequence[str] = (),
          tiled: bool = False, checkpoint: str = "none") -> None:
    """Every rule of expert parallelism, one line each (before any rank starts, and again where
    a model is built)."""
    require(isinstance(ep, int) and not isinstance(ep, bool) and ep >= 1, "ep", ep,
            "must be a positive integer (ranks an MoE layer's experts are spread over)")
    if ep == 1:
        return
    require(cfg.experts > 0, "ep", ep, "needs a mixture-of-experts model (this model has no MoE "
            "layer to spread over ranks): use ep 1")
    check_ep(ep, world, cfg.experts)
    require(states in EP_STATES, "states", states, f"with ep {ep} must be one of "
            f"{', '.join(EP_STATES)} (zero1 and dist-opt do not shard the experts by EP yet)")
    require(not set(offload) - {"activations"}, "offload", list(offload), f"with ep {ep} may "
            "only be activations: the experts' states are held outside FSDP2, not offloaded")
    require(not tiled, "tiled", tiled, f"must be false with ep {ep}: a tile a rank would be an "
            "all-to-all a tile, and the ranks of an EP group hold different numbers of tiles")
    require(checkpoint in EP_CHECKPOINTS, "checkpoint", checkpoint, f"with ep {ep} must be one "
            f"of {', '.join(EP_CHECKPOINTS)} (the sequence modes split a rank's tokens unevenly "
            "across the EP group)")
    require(states != "fsdp" or cfg.experts % world == 0, "ep", ep, f"under fsdp needs the "
            f"experts ({cfg.experts}) to split evenly over the {world} ranks (each holds "
            "E / world of them, gathered over the ranks holding the same EP slice)")


def build(ep: int, groups: ExpertGroups | None, cfg: ModelConfig, policy: StatePolicy,
          checkpoint: str, tile: int | None, mesh: Mesh | None, dp: int) -> ExpertParallel | None:
    """The model's ExpertParallel (None where ep is 1): `groups` if given, else built here over
    the world, collectively (the mesh's nodes and emulated links classing its transfers)."""
    if ep == 1:
        return None
    require(dist.is_available() and dist.is_initialized(), "ep", ep,
            "needs an initialised process group")
    check(ep, cfg, dist.get_world_size() if groups is None else ep * groups.edp_size,
          policy.states, policy.offload, tile is not None, checkpoint)
    if groups is None:
        whole = mesh is not None and mesh.size == dist.get_world_size()
        links = next(iter(mesh.comms.values())).links if mesh is not None and mesh.comms else None
        groups = build_expert_groups(ep, nodes=mesh.nodes if whole else None, links=links)
    require(groups is not None and groups.ep == ep, "ep", ep, "must be the groups' EP size")
    return ExpertParallel(groups, policy.sharded, dp)


class _Syncs:
    """Several GradSyncs begun together (the loss's backward node begins them)."""

    def __init__(self, syncs: list[grads.GradSync]):
        self.syncs = syncs

    def begin(self) -> None:
        for s in self.syncs:
            s.begin()


def grad_sync(net: torch.nn.Module, group: dist.ProcessGroup | None,
              dp_group: dist.ProcessGroup | None, dp: int):
    """Replicated states' gradient reduction: every tensor summed over SP, averaged over DP;
    under EP the experts' summed over their EDP group instead (already / dp: `weights`)."""
    experts: ExpertParallel | None = net.experts
    if experts is None:
        return grads.GradSync(net.parameters(), group, dp_group, dp)
    dense = [p for n, p in net.named_parameters() if not is_expert(n)]
    syncs = [grads.GradSync(dense, group, dp_group, dp)]
    if experts.groups.edp is not None:
        syncs.append(grads.GradSync(expert_params(net), experts.groups.edp, None, 1))
    return _Syncs(syncs)


def full(experts: ExpertParallel | None, name: str, t: Tensor, total: int) -> Tensor:
    """The whole tensor of parameter `name`'s stored `t` (every rank calls it)."""
    if experts is not None and is_expert(name):
        return experts.full(t, total)
    return t.full_tensor() if hasattr(t, "full_tensor") else t
