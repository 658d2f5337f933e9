"""The planner's host: what issuing a step costs (`planner.host`: `rules.ops`' counts at the
cluster's issue rates), added to the device's time on a CPU and overlapping it on a GPU, a `host`
part, the host-bound flag and its words, the deal's cost model from the same counts, and
`degrees: cost` / `algorithm: auto` in a plan of lengths."""

from __future__ import annotations

from pathlib import Path

import pytest

from seqpar.planner import clusters, host
from seqpar.planner.lengths import Workload, deal_cost, issue_s
from seqpar.planner.lengths_plan import LengthPlan
from seqpar.planner.policy import Filters, Policy, space
from seqpar.planner.search import Setup
from seqpar.planner.step import _host_issue, step
from seqpar.planner.why import why_slower
from seqpar.rules import ops
from seqpar.rules.model import load

ROOT = Path(__file__).resolve().parents[2]
MODEL = str(ROOT / "benchmarks" / "plan_lengths_model.yaml")
LONG_TAIL = "lognormal:mean=1024,sigma=1.5,min=128,max=8192"
H100 = clusters.load("h100-sxm")


def _step(cluster, seq_len: int, world: int = 4, model: str = "llama2-7b", ckpt: str = "none"):
    cfg = load(model)
    setup = Setup(cluster, cfg, seq_len, None, world, 1, "bfloat16", 1, "flash2")
    attn = setup.attention(world, "ring", {}, "zigzag")
    return step(setup, 1, world, attn, Policy("replicated", ckpt)), setup


def test_issuing_counts_the_table_at_the_clusters_rates():
    cfg = load(MODEL)
    per = H100.dispatch_us * 1e-6
    got, wait = host.micro_seconds(H100, cfg, algorithm="ring", d=4, layout="zigzag",
                                   options={}, checkpoint="none", kernel="flash2")
    assert wait == 0.0  # a GPU's links carry its messages: no host waits
    want = 0.0
    for phase in ("forward", "backward"):
        a = ops.attention("ring", 4, phase=phase)
        b = ops.block("none", phase)
        launches = (a.ops + b.ops + a.kernel_calls * ops.KERNEL_OPS["flash2"][phase]
                    + a.collectives + a.messages + b.collectives + b.messages)
        want += cfg.layers * launches * per + ops.micro(phase).ops * per
    assert got == pytest.approx(want, rel=1e-12)
    # a free host issues for nothing: the planner before it had a host
    assert host.micro_seconds(H100.model_copy(update={"dispatch_us": 0.0}), cfg,
                              algorithm="ring", d=4, layout="zigzag", options={},
                              checkpoint="none", kernel="flash2") == (0.0, 0.0)


def test_a_gpu_overlaps_the_host_and_a_long_step_hides_it():
    s, _ = _step(H100, 131072)
    free, _ = _step(H100.model_copy(update={"dispatch_us": 0.0}), 131072)
    assert s.step_ms == pytest.approx(free.step_ms, rel=1e-9)  # the device is the longer
    assert s.parts["host"] == pytest.approx(0.0, abs=1e-9) and not s.host_bound
    assert sum(s.parts.values()) == pytest.approx(s.step_ms, rel=1e-9)
    # a short step of a small model: the host issues longer than the device runs, each stretch
    # (the micro-batch, the step's own work) as long as its issuing
    short, setup = _step(H100, 512, model="tiny", ckpt="full")
    train = Policy("replicated", "full").train("bfloat16")
    issue_micro, issue_once, queued = (1e3 * x for x in _host_issue(setup, short.attention,
                                                                     train, 1, 4))
    assert queued == 0.0  # a GPU cluster's collectives wait on no shared cores
    assert short.host_bound and short.parts["host"] > 0.9 * short.step_ms
    assert short.step_ms == pytest.approx(issue_micro + issue_once, rel=1e-9)
    assert "host-bound" in why_slower(short, short)


def test_a_cpu_host_adds_its_issuing_to_the_compute():
    # what its ranks cost one another beside the issue is `planner.contention`'s (test_contention)
    local = clusters.load("local").model_copy(update={"spread": {}, "transport_cpu_us": {}})
    assert local.dispatch_us > 0 and not host.overlaps(local)
    cfg = load("tiny")
    setup = Setup(local, cfg, 1024, None, 2, 1, "float32", 1, "flash2")
    attn = setup.attention(2, "ring", {}, "zigzag")
    s = step(setup, 1, 2, attn, Policy("replicated", "none"))
    free = step(Setup(local.model_copy(update={"dispatch_us": 0.0, "waits_us": {}}), cfg, 1024,
                      None, 2, 1,
                      "float32", 1, "flash2"), 1, 2, attn, Policy("replicated", "none"))
    micro = host.micro_seconds(local, cfg, algorithm="ring", d=2, layout="zigzag", options={},
                               checkpoint="none", kernel="flash2", world=2)
    once = host.step_seconds(local, cfg, states="replicated", world=2)
    assert micro[1] > 0 and once[1] > 0  # its messages and collectives wait on the peer
    # the gradient's all-reduces queued behind the first wait beside the backward (GradSync)
    queued = host.queued_seconds(local, cfg, states="replicated", world=2)
    hidden = 1e3 * (sum(micro) + sum(once)) - s.parts["host"]
    assert 0 < queued < once[1] and 0 < hidden <= 1e3 * queued * (1 + 1e-9)
    assert s.step_ms == pytest.approx(free.step_ms + s.parts["host"], rel=1e-9)


def test_the_deal_costs_a_micro_batch_by_the_same_counts():
    cfg = load(MODEL)
    cost = deal_cost(cfg, H100, "bfloat16", capacity=2048, world=16, ranks_per_node=4)
    assert cost.host_overlaps
    at = dict(cost.fixed_at)
    assert set(at) == {1, 2, 4, 8, 16}
    for d in at:
        assert at[d] == pytest.approx(issue_s(H100, cfg, d, "ring", {}, "zigzag", 16))
    assert at[1] < at[2] < at[16]  # a ring's steps cost their issue
    # a short sequence on a large group: the host's issue, not its FLOPs, sets its time
    n = 256
    assert cost.of(cost.attention_s(n, 16), n, 16) == pytest.approx(at[16])
    assert cost.of(cost.attention_s(n, 1), n, 1) < cost.of(cost.attention_s(n, 16), n, 16)


def test_a_plan_of_lengths_has_a_host_part_and_dynamic_issues_less():
    """A small model's step on H100s is host-bound under both policies; the dynamic one issues
    less (short sequences on one GPU: no all-to-alls, no ring steps), and the host model only
    ever adds to a step."""
    work = Workload.of(LONG_TAIL, 2 ** 17, 8192, 2048, batches=1)
    best = {}
    for name, c in (("host", H100), ("free", H100.model_copy(update={"dispatch_us": 0.0}))):
        steps = LengthPlan.make(c, "tiny", work, 16, 4).search()
        best[name] = {p: next(s for s in steps if s.fits and s.sp_policy == p
                              and not s.split.equal_counts and s.algorithm != "auto")
                      for p in ("static", "dynamic")}
        for s in best[name].values():
            assert sum(s.parts.values()) == pytest.approx(s.step_ms, rel=1e-6)
    host, free = best["host"], best["free"]
    assert all(s.host_bound for s in host.values())
    assert host["static"].parts["host"] > host["dynamic"].parts["host"] > 0
    assert all(host[p].step_ms > free[p].step_ms for p in host)


def test_auto_and_degrees_by_cost_in_a_plan_of_lengths():
    work = Workload.of(LONG_TAIL, 2 ** 17, 8192, 2048, batches=1)
    plan = LengthPlan.make(H100, MODEL, work, 16, 4)
    auto = plan.search(Filters(algorithm="auto"), policies=("dynamic",))
    assert auto and all(s.algorithm == "auto" for s in auto)
    s = auto[0]
    assert s.by_size[1][0] == "local" and len(s.by_size) > 1
    assert s.json()["options_by_size"]["1"]["algorithm"] == "local"
    # auto picks, at each size, what the plan predicts fastest there: no fixed algorithm is
    # faster on the same deal
    fixed = [t for t in plan.search(policies=("dynamic",)) if t.algorithm != "auto"
             and t.split == s.split and t.policy == s.policy and t.layout == s.layout]
    assert fixed and s.step_ms <= min(t.step_ms for t in fixed) * (1 + 1e-6)
    smallest = plan.search(policies=("dynamic",))[0]
    cost = plan.search(policies=("dynamic",), degrees="cost")
    assert cost[0].split.degrees == "cost" and cost[0].json()["degrees"] == "cost"
    assert cost[0].step_ms <= smallest.step_ms * 1.02  # the deal's model, not the plan's: near


def test_queued_collectives_and_dist_opts_closing_pass():
    local = clusters.load("local")
    cfg = load("tiny")
    tensors = host.param_tensors(cfg)
    # the gradient's all-reduces: the first waits on the peers' compute, the rest queue behind it
    red = ops.reduction(tensors, world=2)
    assert (red.collectives, red.queued) == (1.0, tensors - 1.0)
    message, collective, queued = host.waits(local, 2)
    assert host.wait_seconds(local, red, 2) == pytest.approx(collective + (tensors - 1) * queued)
    # an entry of two numbers (an older calibration) queues at a collective's wait
    old = local.model_copy(update={"waits_us": {2: (100.0, 300.0)}})
    assert host.waits(old, 2) == pytest.approx((1e-4, 3e-4, 3e-4))
    # dist-opt's closing pass: one more micro-batch on the rank alone, issued and charged
    closing = host.closing(cfg)
    assert closing == host.micro_issue(cfg, algorithm="local", d=1, layout="contiguous",
                                       options={}, checkpoint="none")
    closing_cpu = sum(host.issue_seconds(local, i, host.kernel_ops(local, "", ph))
                      for i, ph in closing)
    fsdp = host.step_seconds(local, cfg, states="dp_sp", world=2)
    dist = host.step_seconds(local, cfg, states="dist-opt", world=2)
    assert dist[0] == pytest.approx(fsdp[0] + closing_cpu) and dist[1] == fsdp[1]
    # a pool of one has no closing pass
    assert host.step_seconds(local, cfg, states="dist-opt", world=1) == \
        host.step_seconds(local, cfg, states="dp_sp", world=1)


def test_a_plan_of_lengths_searches_dist_opt_and_a_fixed_length_one_when_asked():
    """dist-opt lets the dynamic policy shard its states without equal counts: a plan of lengths
    weighs it beside replicated, zero1 and FSDP; a fixed-length search only with --states."""
    work = Workload.of(LONG_TAIL, 2 ** 17, 8192, 2048, batches=1)
    steps = LengthPlan.make(H100, MODEL, work, 16, 4).search(policies=("dynamic",))
    held = {s.policy.states for s in steps}
    assert {"replicated", "zero1", "dist-opt"} <= held
    dist = min((s for s in steps if s.policy.states == "dist-opt"), key=lambda s: s.step_ms)
    replicated = min((s for s in steps if s.policy.states == "replicated"),
                     key=lambda s: s.step_ms)
    assert dist.memory["states"] < replicated.memory["states"]  # sharded over the pool
    assert "dist-opt" not in {p.states for p in space(Filters(), 2, sp=8, per_node=4)}
    assert {p.states for p in space(Filters(states="dist-opt"), 2, sp=8, per_node=4)} == \
        {"dist-opt"}
