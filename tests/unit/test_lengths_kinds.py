"""Plans of lengths for the attention kinds of issue 43: a hybrid's linear layers priced as the
fixed-length step prices them (LASP-2's chunked rule a token of a rank and its all-gather of states
a micro-batch, only the softmax layers seeing (query, key) pairs), in the contiguous layout LASP
needs; an MLA model's ring with the cheaper of its two passes (K,V or the latent), or the pass a
trial ran with."""

from __future__ import annotations

import pytest

from seqpar.errors import ConfigError
from seqpar.planner import clusters
from seqpar.planner.compute import linear_at_rate
from seqpar.planner.lengths import Workload, softmax_layers
from seqpar.planner.lengths_plan import LengthPlan
from seqpar.planner.policy import Filters
from seqpar.planner.setup import Setup

H100 = clusters.load("h100-sxm")


def plan_of(model: str, **kw) -> LengthPlan:
    work = Workload.of("fixed:8192", tokens=8192 * 4, longest=8192, capacity=2048, seed=0)
    return LengthPlan.make(H100, model, work, 8, 2, **kw)


def test_a_hybrids_micro_batch_costs_its_softmax_and_its_linear_layers():
    # 4 sequences of 8,192 on 2 replicas of 4 ranks: 2 micro-batches a rank, each one sequence
    plan = plan_of("kinds-hybrid-8b")
    cfg = plan.cfg
    linear = cfg.layer_types.count("linear")
    assert linear == 24 and softmax_layers(cfg) == 8
    for name in ("ring", "ulysses"):
        steps = [s for s in plan.search(Filters(algorithm=name, sp=4), ("static",), ("best-fit",))
                 if s.policy.states == "replicated"]
        s = steps[0]
        assert s.layout == "contiguous"  # LASP's
        p = plan.rates(4, name, s.options, s.layout).prediction
        setup = Setup(plan.cluster, cfg, 8192, None, 4, 1, plan.dtype)
        lasp = linear_at_rate(plan.cluster, cfg, plan.dtype, setup.linear(4))
        total = (s.parts["attention"] + s.parts["attention_comm"]) / 2
        assert total == pytest.approx(8 * p.attention_ms + 24 * lasp.attention_ms, rel=1e-6)
    with pytest.raises(ConfigError, match="layout='zigzag'"):
        plan.search(Filters(layout="zigzag", sp=4), ("static",), ("best-fit",))


@pytest.mark.parametrize("mla_pass", (None, "kv", "latent"))
def test_an_mla_ring_carries_the_cheaper_pass_or_the_one_asked(mla_pass):
    plan = plan_of("kinds-mla-8b")
    plan.mla_pass = mla_pass
    setup = Setup(plan.cluster, plan.cfg, 8192, None, 4, 1, plan.dtype)
    kv = setup.attention(4, "ring", {}, "zigzag")
    latent = setup.latent(4, kv)
    got = plan.rates(4, "ring", {}, "zigzag").prediction
    want = {"kv": kv, "latent": latent, None: min(kv, latent, key=lambda q: q.attention_ms)}
    assert got.mla_pass == want[mla_pass].mla_pass
    assert got.attention_ms == pytest.approx(want[mla_pass].attention_ms, rel=1e-9)
    assert latent.bytes_intra + latent.bytes_inter < kv.bytes_intra + kv.bytes_inter
    ulysses = plan.rates(4, "ulysses", {}, "zigzag").prediction  # moves heads: K,V
    assert ulysses.mla_pass == "kv"


@pytest.mark.parametrize("linear_sp", ("lasp2", "lasp1"))
def test_a_hybrids_linear_layers_are_priced_under_the_lasp_its_trial_ran(linear_sp):
    # `predict_case` sets the trial's mode (`plan.linear_sp`); a plan of lengths prices LASP-2
    plan = plan_of("kinds-hybrid-8b")
    assert plan.linear_sp == "lasp2"
    plan.linear_sp = linear_sp
    setup = Setup(plan.cluster, plan.cfg, 8192, None, 4, 1, plan.dtype)
    want = linear_at_rate(plan.cluster, plan.cfg, plan.dtype, setup.linear(4, linear_sp))
    got = plan.rates(4, "ring", {}, "contiguous")
    assert got.mixer_fixed == pytest.approx(
        24 * max(0.0, want.attention_ms - want.compute_ms) / 1e3, rel=1e-9)
    plan.linear_sp = "lasp1" if linear_sp == "lasp2" else "lasp2"
    other = plan.rates(4, "ring", {}, "contiguous")  # the other mode: its own rates, not memoised
    assert (other.mixer, other.mixer_fixed) != pytest.approx((got.mixer, got.mixer_fixed))
