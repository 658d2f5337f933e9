"""Model states — parameters, gradients, optimizer moments — replicated, sharded with torch FSDP2,
or the optimizer's moments alone sharded (ZeRO-1).

    policy = StatePolicy(states="fsdp", master_dtype=torch.float32, offload=("params",))
    policy.check(compute_dtype, device)          # one-line ConfigErrors before anything is built
    shard_model(net, blocks, mesh, policy, compute_dtype, dp)
    opt = optimizer(net.parameters(), policy, group, lr=1e-3)   # AdamW, or ZeRO-1's over `group`

`replicated` keeps every state on every rank (gradients all-reduced by the model itself).
`zero1` does too, but each rank keeps AdamW's moments of its share of the parameters only and
updates those (torch's ZeroRedundancyOptimizer, which then broadcasts each updated parameter from
the rank that owns it): the moments are two thirds of the states of an fp32 model, and a step of
lengths, whose ranks run different numbers of micro-batches, cannot use FSDP's per-layer gathers
but can shard these.
`fsdp` shards them over the whole DP x SP world, one FSDP unit per transformer block plus the root
(embedding, final norm, head), as torchtitan does over dp_shard x cp. With a `master_dtype` the
sharded parameters (what an optimizer updates) are in that dtype and FSDP2's MixedPrecisionPolicy
gathers them in the compute dtype and reduces gradients in the master dtype.
`dist-opt` is Megatron-LM's distributed optimizer on the same FSDP2 units: the parameters are
gathered once a step and kept (`reshard_after_forward=False`), gradients accumulate unsharded and
are reduce-scattered once (`accumulate`, `gather`: a step of lengths gathers before its first
micro-batch and reduces after its last, so every rank issues the same collectives whatever its
micro-batch count); AdamW's moments and the master weights are the shards.

The gradient of a sequence-parallel model is a *sum* over SP ranks (each holds the loss of its
tokens) and a *mean* over DP replicas. FSDP2 averages over the ranks it shards across (DP x SP), so
the divide factor is set to DP: sum over the world / DP, whatever FSDP's default becomes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from seqpar.algorithms import ledger
from seqpar.errors import require
from seqpar.rules import memory as memory_rules
from seqpar.rules.memory import SHARDED, STATES


@dataclass(frozen=True)
class StatePolicy:
    """Where the model states live and in which dtype (the runner and the planner read this)."""

    states: str = "replicated"                 # STATES
    master_dtype: torch.dtype | None = None    # None: parameters in the compute dtype
    offload: tuple[str, ...] = ()              # drawn from OFFLOAD (CUDA only); True: FSDP2's

    def __post_init__(self) -> None:
        object.__setattr__(self, "offload", memory_rules.offload_tuple(self.offload))

    def check(self, dtype: torch.dtype, device: torch.device | None) -> None:
        """Every rule; the device's only where it is known (None: before any rank starts)."""
        require(self.states in STATES, "states", self.states, f"must be one of {', '.join(STATES)}")
        require(self.master_dtype is None or (self.master_dtype.is_floating_point
                and torch.finfo(self.master_dtype).bits >= torch.finfo(dtype).bits),
                "master_dtype", self.master_dtype,
                f"must be a floating dtype at least as wide as the compute dtype ({dtype})")
        check_offload(self.offload, self.states, None if device is None else device.type)

    @property
    def sharded(self) -> bool:
        """Parameters sharded by FSDP2 (fsdp, dist-opt)."""
        return self.states in SHARDED

    def param_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype parameters are stored in (what the optimizer updates)."""
        return self.master_dtype or dtype


def check_offload(offload: tuple[str, ...], states: str, device_type: str | None) -> None:
    """The offload rules (`rules.memory.check_offload`: what each moves, and with what) and the
    runner's own: all need CUDA (on a CPU device every state is in host memory already;
    `device_type` None: not known yet, before any rank starts)."""
    memory_rules.check_offload(offload, states)
    if not offload:
        return
    kind = "cuda" if device_type is None else device_type
    require(kind == "cuda", "offload", list(offload), "needs CUDA: it moves device memory to the "
            f"host, and on a {kind} device everything is in host memory already")

def shard_model(net: nn.Module, blocks: Iterable[nn.Module], mesh, policy: StatePolicy,
                dtype: torch.dtype, dp: int, ignored: set[nn.Parameter] | None = None) -> None:
    """fully_shard each block, then the root, over the 1-D DeviceMesh `mesh` (the whole world);
    `ignored` (expert parallelism's experts, sharded by `model.ep` over their own ranks) left
    out."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    stored = policy.param_dtype(dtype)
    mp = MixedPrecisionPolicy(param_dtype=None if stored == dtype else dtype, reduce_dtype=stored)
    offload = CPUOffloadPolicy() if "params" in policy.offload else OffloadPolicy()
    units = [*blocks, net]
    keep = policy.states == "dist-opt"  # gathered once a step, kept through backward
    for unit in units:
        fully_shard(unit, mesh=mesh, mp_policy=mp, offload_policy=offload,
                    reshard_after_forward=not keep, ignored_params=ignored)
    if keep:
        _book_collectives(units)
    for unit in units:
        unit.set_gradient_divide_factor(float(dp))
        if mesh.device_type == "cpu":  # gloo has no PREMUL_SUM: sum, then scale
            unit.set_force_sum_reduction_for_comms(True)


def fsdp_units(net: nn.Module) -> list:
    """The FSDP2 units of `net`, the root first, then its blocks in order (one order on every rank)."""
    from torch.distributed.fsdp import FSDPModule

    return [m for m in net.modules() if isinstance(m, FSDPModule)]


def gather(net: nn.Module) -> None:
    """dist-opt: every unit's parameters all-gathered now, one all-gather a unit, root first (every
    rank of the pool calls it, whatever it runs next); forwards then find them gathered."""
    for unit in fsdp_units(net):
        unit.unshard()


def accumulate(net: nn.Module, on: bool) -> None:
    """dist-opt: `on`, backwards accumulate unsharded gradients and keep the gathered parameters (no
    reduce-scatter, no resharding); off, FSDP2's defaults again: the next backward reduce-scatters
    the accumulated gradients and reshards."""
    root = fsdp_units(net)[0]  # both setters recurse into every unit
    root.set_requires_gradient_sync(not on)
    root.set_reshard_after_backward(not on)


class _Booked:
    """FSDP2's all-gather or reduce-scatter (its custom-comm interface: `allocate`, then the call)
    booking the bytes it sends into the ledgers (NCCL-tests' convention: an all-gather sends its
    shard to each of the G - 1 others, a reduce-scatter (G - 1)/G of its input), op 'all_gather'
    or 'reduce_scatter', group 'states'. Backward may run on another thread (CUDA), where no
    ledger is active: a reduce-scatter books into those the last all-gather saw (the step's)."""

    def __init__(self, op: str, seen: list) -> None:
        self.op, self.seen = op, seen  # seen: [the ledgers active at the last all-gather]

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup, op=None, async_op: bool = False):
        gathering = self.op == "all_gather"
        if gathering:
            self.seen[:] = [ledger.active()]
        size, me = dist.get_world_size(group), dist.get_rank(group)
        sent = input_tensor.numel() * input_tensor.element_size()
        per_peer = sent if gathering else sent // size
        mine = dist.get_global_rank(group, me)
        for book in ledger.active() or self.seen[0]:
            for peer in (p for p in range(size) if p != me):
                book.add(self.op, "states", book.link(mine, dist.get_global_rank(group, peer)),
                         per_peer)
        if gathering:
            return dist.all_gather_single(output_tensor, input_tensor, group=group,
                                          async_op=async_op)
        return dist.reduce_scatter_single(output_tensor, input_tensor, op=op, group=group,
                                          async_op=async_op)


def _book_collectives(units_: list) -> None:
    seen: list = [()]
    for unit in units_:
        unit.set_custom_all_gather(_Booked("all_gather", seen))
        unit.set_custom_reduce_scatter(_Booked("reduce_scatter", seen))


def is_sharded(p: torch.Tensor) -> bool:
    return hasattr(p, "full_tensor") and hasattr(p, "to_local")


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a (possibly DTensor) tensor."""
    return t.to_local() if is_sharded(t) else t


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor (an all-gather for a sharded DTensor: every rank must call it)."""
    return t.full_tensor() if is_sharded(t) else t


def assign(p: torch.Tensor, value: torch.Tensor) -> None:
    """Set parameter `p` to the full tensor `value` (a sharded one takes its own shard, computed
    locally: every rank holds the same `value`, so nothing is communicated)."""
    if is_sharded(p):
        from torch.distributed.tensor import distribute_tensor

        value = distribute_tensor(value.to(p.device), p.device_mesh, p.placements, src_data_rank=None)
    p.copy_(value)


def optimizer(params: Iterable[nn.Parameter], policy: StatePolicy,
              group: dist.ProcessGroup | None, lr: float) -> torch.optim.Optimizer:
    """AdamW over `params` (each rank's shards under fsdp and dist-opt); under zero1 torch's
    ZeroRedundancyOptimizer of AdamW over `group` (the ranks whose gradients are already summed
    alike: the DP x SP world, or a step's pool), each rank holding the moments of its share
    (`rules.memory.zero1_partition`). One kernel over all tensors (`step_kind`)."""
    params = list(params)
    kind = step_kind(params)
    if policy.states != "zero1" or group is None or dist.get_world_size(group) == 1:
        # FSDP2's DTensors beside plain tensors (expert parallelism's experts): one multi-tensor
        # update each, as foreach takes one kind at a time
        kinds = [g for g in ([p for p in params if is_sharded(p)],
                             [p for p in params if not is_sharded(p)]) if g]
        groups = [{"params": g} for g in kinds] if len(kinds) > 1 else params
        return torch.optim.AdamW(groups, lr=lr, **kind)
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, process_group=group,
                                   lr=lr, **kind)


def step_kind(params: list[torch.Tensor]) -> dict[str, bool]:
    """AdamW's implementation: fused on CUDA (one kernel), else foreach (torch's multi-tensor ops:
    bit for bit the per-parameter loop's numbers in float64, tests/model/test_policies.py), never
    the per-parameter loop."""
    if params and all(p.device.type == "cuda" for p in params):
        return {"fused": True}
    return {"foreach": True}
