"""The planner's zero1 states (AdamW's moments sharded over DP x SP by torch's
ZeroRedundancyOptimizer, parameters and gradients replicated): its memory is rules.memory's
partition, its traffic the replicated all-reduce plus one all-gather of the parameters, its
optimizer the largest share's; a step of lengths runs it without equal counts; a zero1 trial is
predicted (and validated) as zero1."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from seqpar.errors import ConfigError
from seqpar.experiments.spec import ExperimentSpec, specs_of
from seqpar.planner import clusters
from seqpar.planner import plan as perf_plan
from seqpar.planner.fsdp import traffic
from seqpar.planner.lengths import Workload
from seqpar.planner.lengths_plan import LengthPlan
from seqpar.planner.memory import communicators
from seqpar.planner.policy import Filters, Policy, space
from seqpar.planner.search import make_setup
from seqpar.planner.step import step
from seqpar.planner.trial import predict_trial
from seqpar.rules.memory import ELEM, zero1_partition

RNG = random.Random()
H100 = clusters.load("h100-sxm")
MODEL = str(Path(__file__).resolve().parents[2] / "benchmarks" / "plan_lengths_model.yaml")


def _steps(world: int, nodes: int, dp: int):
    setup = make_setup(H100, MODEL, 8192, 8192 * 2 * dp, world, nodes)
    sp = world // dp
    attn = setup.attention(sp, "ring", {}, "zigzag")
    return setup, {st: step(setup, dp, sp, attn, Policy(st, "full"))
                   for st in ("replicated", "zero1", "dp_sp")}


def test_zero1_holds_whole_params_and_grads_and_the_largest_share_of_the_moments():
    world, dp = RNG.choice([(8, 2), (8, 8), (16, 4)])
    setup, got = _steps(world, world // 4, dp)
    cfg = setup.cfg
    whole, share = cfg.params(), max(zero1_partition(cfg, world))
    assert share < whole  # the embedding alone (vocab x hidden) bounds it from below
    # bf16 with fp32 master weights: params and grads 4 bytes each, two fp32 moments of the share
    assert got["zero1"].memory["states"] == 2 * 4 * whole + 2 * 4 * share
    assert got["replicated"].memory["states"] > got["zero1"].memory["states"] > \
        got["dp_sp"].memory["states"]
    # AdamW over the largest share only: its optimizer part scales by it
    assert got["zero1"].parts["optimizer"] == pytest.approx(
        got["replicated"].parts["optimizer"] * share / whole, rel=1e-9)
    # one DP x SP group reduces the gradients and broadcasts the parameters: replicated's count
    assert communicators("ring", world // dp, dp, "zero1", 4) == communicators(
        "ring", world // dp, dp, "replicated", 4)


def test_the_search_offers_zero1_where_it_is_its_own_choice():
    assert "zero1" not in {p.states for p in space(dp=1, sp=1)}  # on one rank: replicated
    mine = [p for p in space(dp=RNG.choice([1, 2]), sp=4, per_node=4) if p.states == "zero1"]
    assert mine and all("params" not in p.offload for p in mine)  # FSDP2's offload only
    assert all(p.train("bfloat16").states == "zero1" for p in mine)
    with pytest.raises(ConfigError, match="'params' moves FSDP's sharded states"):
        Filters(states="zero1", offload=("optimizer", "params"))  # one line, not an empty search


def test_zero1_traffic_is_the_replicated_all_reduce_and_one_all_gather_of_the_parameters():
    dp, world = RNG.choice([(2, 4), (4, 4), (1, 4)])  # one node: every byte on NVLink
    setup, got = _steps(world, 1, dp)
    cfg, sp = setup.cfg, world // dp
    policy = Policy("zero1", "full")
    zero1 = traffic(setup.net, cfg, "bfloat16", dp, sp, policy, policy.train("bfloat16"))
    rep = traffic(setup.net, cfg, "bfloat16", dp, sp, Policy("replicated", "full"),
                  Policy("replicated", "full").train("bfloat16"))
    assert zero1.gather.seconds == zero1.scatter.seconds == zero1.root == 0.0  # no FSDP
    assert (zero1.reduce, zero1.reduce_root) == (rep.reduce, rep.reduce_root)
    # the broadcast from each parameter's owner: (P - 1) / P of every fp32 master parameter
    assert zero1.update.intra == round((world - 1) / world * cfg.params() * 4)
    assert zero1.update.inter == 0 and rep.update.seconds == 0.0
    # the step: replicated's, with AdamW over the share and the broadcast exposed after it
    z, r = got["zero1"], got["replicated"]
    assert z.step_ms == pytest.approx(r.step_ms - r.parts["optimizer"] + z.parts["optimizer"]
                                      + 1e3 * zero1.update.seconds, rel=1e-9)
    assert z.parts["exposed_comm"] == pytest.approx(
        r.parts["exposed_comm"] + 1e3 * zero1.update.seconds, rel=1e-9)


def test_a_step_of_lengths_runs_zero1_on_the_free_deal():
    work = Workload.of("lognormal:mean=1024,sigma=1.5,min=128,max=8192", tokens=2 ** 18,
                       longest=8192, capacity=2048, seed=RNG.randrange(50))
    plan = LengthPlan.make(H100, MODEL, work, 8, 2)
    pinned = {"algorithm": "ring", "checkpoint": "full", "fused_head": True, "tiled": False}
    got = {st: plan.search(Filters(states=st, **pinned), ("dynamic",)) for st in
           ("replicated", "zero1", "dp_sp")}
    (rep,), (zero1,), (fsdp,) = (got[st] for st in ("replicated", "zero1", "dp_sp"))
    assert not rep.split.equal_counts and not zero1.split.equal_counts and fsdp.split.equal_counts
    update = traffic(plan.setup.net, plan.cfg, "bfloat16", 8, 1, zero1.policy,
                     zero1.policy.train("bfloat16")).update.seconds
    assert update > 0
    # the same deal and compute; the broadcast exposed, AdamW over the largest share
    for part in ("attention", "attention_comm", "other_compute", "recompute", "idle"):
        assert zero1.parts[part] == pytest.approx(rep.parts[part], rel=1e-9), part
    assert zero1.parts["exposed_comm"] == pytest.approx(rep.parts["exposed_comm"] + 1e3 * update,
                                                        rel=1e-9)
    assert zero1.parts["optimizer"] < rep.parts["optimizer"]
    assert rep.memory["states"] > zero1.memory["states"] > fsdp.memory["states"]


def _spec(**plan_extra) -> ExperimentSpec:
    lengths = plan_extra.pop("lengths", None)
    workload = {"seq_len": 128 if lengths else 256}
    if lengths:
        workload |= {"lengths": lengths, "tokens_per_step": 512}
    return ExperimentSpec.parse({
        "model": {"heads": 4, "kv_heads": 2, "head_dim": 16},
        "plan": {"algorithm": "ring", "world": 4, "nodes": 1, **plan_extra},
        "workload": workload, "train": {"model": "tiny", "dp": 1, "states": "zero1"}})


def test_a_zero1_trial_is_predicted_and_validated_as_zero1():
    spec = _spec()
    p = predict_trial(spec, clusters.load("local"))
    cfg = spec.to_case().config()
    assert p.policy.states == "zero1"  # not FSDP's dp_sp
    e = ELEM[spec.workload.dtype]
    assert p.memory["states"] == e * (2 * cfg.params() + 2 * max(zero1_partition(cfg, 4)))
    dynamic = _spec(sp_policy="dynamic", capacity=64,
                    lengths="lognormal:mean=32,sigma=1.5,min=4,max=128")
    trials = [({k: str(v) for k, v in s.flat().items()}, {"step_ms": 40.0})  # as MLflow has them
              for s in (spec, dynamic)]
    checks = perf_plan.validate(specs_of(trials), clusters.load("local"))
    assert len(checks) == 2 and all(c.predicted_ms > 0 for c in checks)
