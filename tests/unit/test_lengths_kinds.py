"""Plans of lengths for the attention kinds of issue 43: a hybrid's linear layers priced as the
fixed-length step prices them (LASP-2's chunked rule a token of a rank and its all-gather of states
a micro-batch, only the softmax layers seeing (query, key) pairs), in the contiguous layout LASP
needs; an MLA model's ring with the cheaper of its two passes (K,V or the latent), or the pass a
trial ran with; a hybrid's linear layers under the faster LASP of each step (the runner runs one a
step), or the one its trial ran."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from seqpar.cli.app import app
from seqpar.errors import ConfigError
from seqpar.planner import clusters
from seqpar.planner.compute import linear_at_rate
from seqpar.planner.lengths import Workload, issue_s, softmax_layers
from seqpar.planner.lengths_plan import LengthPlan
from seqpar.planner.lengths_step import LengthStep
from seqpar.planner.policy import Filters
from seqpar.planner.setup import Setup
from seqpar.rules.linear import LASP_MODES

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
    # `predict_case` sets the trial's mode (`plan.linear_sp`); a plan of lengths prices both
    plan = plan_of("kinds-hybrid-8b")
    assert plan.linear_sp is None and plan.lasp() == "lasp2" and plan.lasps({4: ("ring", {})}) \
        == LASP_MODES
    plan.linear_sp = linear_sp
    setup = Setup(plan.cluster, plan.cfg, 8192, None, 4, 1, plan.dtype)
    want = linear_at_rate(plan.cluster, plan.cfg, plan.dtype, setup.linear(4, linear_sp))
    got = plan.rates(4, "ring", {}, "contiguous")
    assert got.mixer_fixed == pytest.approx(
        24 * max(0.0, want.attention_ms - want.compute_ms) / 1e3, rel=1e-9)
    issued = plan.issue(4, "ring", {}, "contiguous", "none")[0]  # its exchange's host issue
    assert issued == issue_s(plan.cluster, plan.cfg, 4, "ring", {}, "contiguous", 8,
                             linear_sp=linear_sp) > 0
    plan.linear_sp = "lasp1" if linear_sp == "lasp2" else "lasp2"
    other = plan.rates(4, "ring", {}, "contiguous")  # the other mode: its own rates, not memoised
    assert (other.mixer, other.mixer_fixed) != pytest.approx((got.mixer, got.mixer_fixed))
    assert plan.issue(4, "ring", {}, "contiguous", "none")[0] != issued


def _by_config(plan: LengthPlan) -> dict[tuple, LengthStep]:
    return {(s.split, s.algorithm, json.dumps(s.options, sort_keys=True), s.layout, s.policy): s
            for s in plan.search(every=True)}


def test_a_hybrids_plan_of_lengths_keeps_the_faster_lasp_of_each_step():
    # two 16K sequences on 16 ranks over 4 nodes at 2,048 a rank: LASP-1's chain wins some
    # steps, LASP-2's all-gather others; each keeps the faster, LASP-2 on a tie (the runner's)
    work = Workload.of("fixed:16384", tokens=32768, longest=16384, capacity=2048, seed=0)

    def steps(linear_sp: str | None) -> dict[tuple, LengthStep]:
        plan = LengthPlan.make(H100, "kinds-hybrid-8b", work, 16, 4)
        plan.linear_sp = linear_sp
        return _by_config(plan)

    chosen, forced = steps(None), {m: steps(m) for m in LASP_MODES}
    won = set()
    for key, s in chosen.items():
        ms = {m: forced[m][key].step_ms for m in LASP_MODES}
        assert s.step_ms == min(ms.values()) == ms[s.linear_sp]
        assert s.json()["linear_sp"] == s.linear_sp and forced[s.linear_sp][key].linear_sp \
            == s.linear_sp
        won |= {m for m in LASP_MODES if ms[m] < max(ms.values())}
    assert won == set(LASP_MODES)


def test_a_model_without_linear_layers_prices_no_lasp():
    # LLaMA's plan is the same whatever the mode, and names none
    plans = [plan_of("llama3.1-8b") for _ in range(2)]
    plans[1].linear_sp = "lasp1"
    assert plans[0].lasps({4: ("ring", {})}) == ("lasp2",)
    got = [[s.json() for s in p.search(Filters(sp=4), ("static",))] for p in plans]
    assert got[0] == got[1] and not any("linear_sp" in c for c in got[0])


def test_a_plan_of_lengths_shows_the_lasp_of_a_hybrids_steps():
    args = ["plan", "--scope", "cluster", "--cluster", "h100-sxm", "--world", "16", "--nodes",
            "4", "--seq-len", "16384", "--lengths", "fixed:16384", "--capacity", "2048",
            "--sp-policy", "static", "--packing", "best-fit"]
    for model, lasp in (("kinds-hybrid-8b", True), ("llama3.1-8b", False)):
        out = CliRunner().invoke(app, [*args, "--model", model, "--json"])
        assert out.exit_code == 0, out.output
        configs = json.loads(out.output)["configs"]
        assert all((c.get("linear_sp") in LASP_MODES) == lasp for c in configs)
        table = CliRunner().invoke(app, [*args, "--model", model]).output
        assert ("lasp2|lasp1" in table) == lasp  # the legend of the options' column
