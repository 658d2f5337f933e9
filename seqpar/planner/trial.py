"""A finished or planned trial (an ExperimentSpec, a TrainCase) as the planner predicts it: an
attention trial's `api.Prediction`, a training trial's `step.Step` under the trial's own policy,
which this module reads off the case the way the runner does (`policy_of_case`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from seqpar.planner.api import predict_spec
from seqpar.planner.clusters import Cluster
from seqpar.planner.net import Net
from seqpar.planner.policy import REPLICATED, Policy, name_of
from seqpar.planner.step import Setup, step
from seqpar.rules.memory import TrainPolicy
from seqpar.rules.pool import AUTO


def policy_of_case(case: Any) -> tuple[Policy, TrainPolicy]:
    """A training trial's policy as the planner's and the runner's."""
    ck = name_of(case.checkpoint, case.seq_fraction)
    offload = case.offload if isinstance(case.offload, tuple | list) else \
        (("optimizer", "params") if case.offload else ())
    tiled = bool(getattr(case, "tiled", False))
    states = case.states if case.states in REPLICATED else "dp_sp"  # fsdp: over DP x SP
    policy = Policy(states, ck, case.fused_head, tuple(offload), tiled)
    train = TrainPolicy(states=case.states, master_dtype=case.master_dtype, offload=tuple(offload),
                        checkpoint=case.checkpoint, seq_fraction=case.seq_fraction,
                        fused_head=case.fused_head, tiled=tiled)
    return policy, train


def predict_trial(spec: Any, cluster: Cluster, host_links: Cluster | None = None) -> Any:
    """A prediction for any ExperimentSpec: an attention trial's (`api.Prediction`), or a training
    trial's `Step` (its model, DP x SP, its policy and expert parallelism), `memory` holding the
    step's memory parts. `host_links`: where `cluster` emulates links (`plan.emulated`), the host's
    own, which the states' traffic (FSDP2's, the gradients' reductions) runs on unemulated."""
    if spec.train is None:
        return predict_spec(spec, cluster)
    case = spec.to_case()
    cfg, dtype = case.config(), spec.workload.dtype
    setup = Setup(cluster, cfg, case.seq_len, case.seq_len * case.batch * case.dp, case.world,
                  max(1, spec.plan.nodes), dtype, case.batch, cluster.kernel or "flash2",
                  linear_sp=case.linear_sp or "lasp2")
    name, options = case.algorithm, dict(spec.plan.options)
    if name == AUTO:  # what the largest group of its deals runs (the driver chose it)
        name, options = case.options_at(max(case.group_sizes()))
    attn = replace(setup.attention(case.sp, name, options, case.layout), options=options)
    if getattr(case, "mla_pass", "kv") == "latent":  # MLA's latent on the ring, K,V rebuilt
        attn = setup.latent(case.sp, attn) or attn
    if host_links is not None and host_links is not cluster:
        setup.cache["states net"] = Net(host_links, case.world, max(1, spec.plan.nodes))
    policy, train = policy_of_case(case)
    policy = replace(policy, ep=getattr(spec.plan, "ep", 1))  # expert parallelism (plan.ep)
    return step(setup, case.dp, case.sp, attn, policy, train)
