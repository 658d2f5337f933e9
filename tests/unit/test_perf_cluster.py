"""The planner at cluster scope: the whole step of a DP x SP configuration (its parts, what states
sharding, offload and the kernel cost), and a search whose pruning never loses the best."""

from __future__ import annotations

import random

import numpy as np
import pytest

from seqpar.errors import ConfigError
from seqpar.planner import clusters, kernel, rates
from seqpar.planner import search as search_module
from seqpar.planner.clusters import KernelRate
from seqpar.planner.policy import Filters, Policy
from seqpar.planner.search import make_setup, pareto, search, splits
from seqpar.planner.step import Setup, step

RNG = random.Random()
H100 = clusters.load("h100-sxm")


def _setup(world: int = 16, nodes: int = 2, seq_len: int = 32768, sequences: int = 16, **kw):
    return make_setup(H100, "llama3.1-8b", seq_len, seq_len * sequences, world, nodes, **kw)


def test_splits_put_sp_within_a_node_or_over_whole_nodes_with_whole_micro_batches():
    setup = _setup(world=24, nodes=2, sequences=RNG.choice([6, 12, 24]))  # 12 ranks a node
    got = splits(setup)
    for dp, sp, m in got:
        assert dp * sp == 24 and m * dp * setup.seq_len == setup.tokens_per_step
    sequences = setup.tokens_per_step // setup.seq_len
    assert {sp for _, sp, _ in got} == {sp for sp in (1, 2, 3, 4, 6, 12, 24)
                                        if sequences % (24 // sp) == 0}  # not 8: 1.5 nodes


def test_the_bounded_search_finds_the_exhaustive_top():
    setup = _setup(world=16, nodes=2, seq_len=RNG.choice([32768, 65536]), sequences=8)
    f = Filters(checkpoint=RNG.choice([None, "full"]))
    every, bounded = search(setup, f), search(setup, f, keep=10)
    assert bounded.searched < every.searched
    top = [(round(s.tgs, 6), s.dp, s.sp) for s in every.fitting[:10]]
    assert [(round(s.tgs, 6), s.dp, s.sp) for s in bounded.fitting[:10]] == top


def test_a_layout_that_deals_alike_is_timed_once_and_ranks_alike(monkeypatch):
    """Without a mask the balanced layout deals zigzag's stretches at every P (`same_deal`), so
    the search reuses zigzag's prediction for it: the ranking is the one timing both gives."""
    assert all(kernel.same_deal("zigzag", "balanced", p) for p in (1, 2, 3, 4, 8, 16, 64))
    assert not any(kernel.same_deal(a, "zigzag", p) for a in ("stripe", "contiguous")
                   for p in (2, 4, 8))
    calls = []
    timing = Setup.attention
    monkeypatch.setattr(Setup, "attention",
                        lambda self, *a: calls.append(a[2]) or timing(self, *a))
    shortcut = search(_setup(world=16, nodes=2, seq_len=32768, sequences=8), keep=10)
    once = list(calls)
    monkeypatch.setattr(search_module, "same_deal", lambda a, b, world: a == b)
    timed = search(_setup(world=16, nodes=2, seq_len=32768, sequences=8), keep=10)
    assert "balanced" not in once and calls.count("balanced") == once.count("zigzag")

    def rows(result):
        return [(s.dp, s.sp, s.attention.algorithm, tuple(sorted(s.attention.options.items())),
                 s.attention.layout, s.policy.label(), s.step_ms, s.peak_mem_bytes)
                for s in result.ranked]

    assert rows(shortcut) == rows(timed)


def test_pareto_keeps_exactly_the_undominated_rows():
    rows = [tuple(RNG.choice([1.0, 2.0, 3.0]) for _ in range(3)) for _ in range(40)]
    keep, same, by = pareto(rows)
    x = np.array(rows)
    for i, r in enumerate(rows):
        beaten = any((x[j] <= x[i]).all() and (x[j] < x[i]).any() for j in range(len(rows)))
        first = rows.index(r) == i
        assert (i in keep) == (not beaten and first)
        assert (i in by) == beaten  # each beaten row names a kept row that beats it
        if beaten:
            j = by[i]
            assert j in keep and (x[j] <= x[i]).all() and (x[j] < x[i]).any()
        if i in keep:
            assert sorted(same[i]) == [j for j in range(len(rows)) if rows[j] == r and j != i]


def test_states_sharding_trades_memory_for_communication():
    setup = _setup(world=16, nodes=2, sequences=16)
    p = setup.attention(2, "ring", {}, "zigzag")
    got = {st: step(setup, 8, 2, p, Policy(st, "full")) for st in ("dp_sp", "sp", "replicated")}
    mem = {k: s.memory["states"] for k, s in got.items()}
    assert mem["dp_sp"] * 8 == pytest.approx(mem["sp"], rel=1e-3)  # sharded over 16 vs 2 ranks
    assert mem["sp"] < mem["replicated"]
    for s in got.values():
        assert sum(s.parts.values()) == pytest.approx(s.step_ms, rel=1e-9)
        assert s.parts["attention"] == pytest.approx(got["dp_sp"].parts["attention"])
    # what is exposed is communication: links 100x faster hide it
    fast = make_setup(H100.model_copy(update={
        "intra": clusters.Link(bandwidth_gb_per_s=1e5, latency_us=0.0),
        "inter": clusters.Link(bandwidth_gb_per_s=1e5, latency_us=0.0)}),
        "llama3.1-8b", 32768, 32768 * 16, 16, 2)
    q = fast.attention(2, "ring", {}, "zigzag")
    for st, s in got.items():
        assert s.parts["exposed_comm"] > 10 * step(fast, 8, 2, q, Policy(st, "full")).parts[
            "exposed_comm"]


def test_offload_costs_host_time_and_frees_device_memory():
    setup = _setup(world=8, nodes=1, seq_len=131072, sequences=1)
    p = setup.attention(8, "ulysses", {}, "zigzag")
    base = step(setup, 1, 8, p, Policy("dp_sp", "full"))
    opt = step(setup, 1, 8, p, Policy("dp_sp", "full", offload=("optimizer", "params")))
    acts = step(setup, 1, 8, p, Policy("dp_sp", "full", offload=("activations",)))
    assert opt.parts["optimizer"] > base.parts["optimizer"]  # a CPU step, over PCIe
    assert opt.memory["states"] < base.memory["states"] and opt.memory["host"] > 0
    assert acts.memory["activations"] < base.memory["activations"]
    assert acts.step_ms >= base.step_ms


def test_the_kernel_sets_the_attention_rate_and_a_measured_one_comes_first():
    fast = _setup(world=8, nodes=1, sequences=1, kernel="flash3").attention(
        8, "ring", {}, "zigzag")
    slow = _setup(world=8, nodes=1, sequences=1, kernel="sdpa-efficient").attention(
        8, "ring", {}, "zigzag")
    assert slow.compute_ms > 2 * fast.compute_ms
    rate = RNG.uniform(100, 900)
    measured = H100.model_copy(update={"kernels": {"flash2": KernelRate(
        forward_full=rate, forward_causal=rate, backward=rate, source="measured here")}})
    c, source = rates.with_kernel(measured, "flash2", 128)
    assert c.attention_tflops["bfloat16"] == rate and source == "flash2: measured here"
    assert c.backward_slowdown("bfloat16") == pytest.approx(1.0)
    with pytest.raises(ConfigError):
        rates.with_kernel(clusters.load("burst-a800"), "sdpa-cudnn", 128)


def test_a_training_trial_is_predicted_by_the_same_step():
    from seqpar.experiments.spec import ExperimentSpec
    from seqpar.planner.step import Step
    from seqpar.planner.trial import predict_trial

    spec = ExperimentSpec.parse({
        "model": {"heads": 4, "kv_heads": 2, "head_dim": 16},
        "plan": {"algorithm": "ring", "world": 4, "nodes": 1},
        "workload": {"seq_len": 256},
        "train": {"model": "tiny", "dp": 2, "states": "fsdp", "checkpoint": "full"}})
    p = predict_trial(spec, clusters.load("local"))
    assert isinstance(p, Step) and (p.dp, p.sp) == (2, 2) and p.policy.states == "dp_sp"
    assert p.memory["peak"] == p.peak_mem_bytes > p.memory["states"] > 0
