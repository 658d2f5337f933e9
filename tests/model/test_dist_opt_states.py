"""dist-opt without ranks: its bad values refused in one line before any rank starts, its partition
and its traffic counts, and AdamW's foreach step bit for bit the per-parameter loop's in float64."""

from __future__ import annotations

import pytest
import torch

from seqpar.case import TrainCase
from seqpar.errors import ConfigError
from seqpar.model.states import StatePolicy, step_kind
from seqpar.planner import clusters
from seqpar.planner.fsdp import traffic
from seqpar.planner.net import Net
from seqpar.planner.policy import Policy
from seqpar.rules.memory import TrainPolicy, dist_opt_bytes, dist_opt_partition, predicted_states
from seqpar.rules.model import load


def test_dist_opt_with_offloaded_states_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="not with states='dist-opt'") as err:
        TrainPolicy(states="dist-opt", offload=("optimizer", "params"))
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="offload"):
        StatePolicy("dist-opt", offload=("params",)).check(torch.float32, None)
    with pytest.raises(ConfigError, match="offload"):
        TrainCase(algorithm="ring", sp=2, states="dist-opt", offload=True).validate()


def test_partition_counts_every_element_once_and_the_traffic_is_the_planners():
    cfg = load("tiny")
    for shards in (1, 2, 3, 8):
        share = dist_opt_partition(cfg, shards)
        assert sum(share) == cfg.params() and len(share) == shards
    # the planner's traffic a step (no padding: every dim 0 of tiny divides by 2) = the runner's
    net, train = Net(clusters.load("local"), 2), TrainPolicy(states="dist-opt")
    got = traffic(net, cfg, "float32", 1, 2, Policy("dist-opt"), train).update
    assert got.intra == dist_opt_bytes(cfg, 2, 4, 4)
    held = predicted_states(cfg, "bfloat16", TrainPolicy(states="dist-opt",
                                                          master_dtype="float32"), 4)
    assert held["buffers"] == cfg.params() * (2 + 4)  # bf16 parameters, fp32 gradients, whole
    assert held["params"] + held["grads"] + held["optimizer"] == 16 * max(dist_opt_partition(cfg, 4))


def _adamw(**kind) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, dtype=torch.float64, generator=gen))
              for s in ((7, 5), (33,), (64, 48), (1,))]
    opt = torch.optim.AdamW(params, lr=1e-3, **kind)
    for _ in range(4):
        for p in params:
            p.grad = torch.randn(p.shape, dtype=torch.float64, generator=gen)
        opt.step()
    return [p.detach() for p in params] + [v for s in opt.state.values() for k, v in s.items()
                                           if k != "step"]


def test_foreach_adamw_is_the_per_parameter_loop_bit_for_bit_in_float64():
    assert step_kind([torch.zeros(1)]) == {"foreach": True}
    for a, b in zip(_adamw(foreach=False), _adamw(**step_kind([torch.zeros(1)])), strict=True):
        assert torch.equal(a, b)
