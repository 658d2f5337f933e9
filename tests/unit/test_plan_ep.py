"""The planner prices expert parallelism (issue 45): the dispatch and combine all-to-alls' bytes
against the analytic count (pairs sent x hidden x dtype, by link), the experts' states and
gathers by their EP share, ep searched only for a mixture of experts, and the bad input lines."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from seqpar.errors import ConfigError
from seqpar.planner import clusters, ep
from seqpar.planner.memory import expert_share, gathered_bytes
from seqpar.planner.policy import Filters, Policy
from seqpar.planner.search import make_setup, search
from seqpar.planner.step import step
from seqpar.rules.counts import layer_numel, routed_numel
from seqpar.rules.memory import comm_buffer_bytes
from seqpar.rules.model import load

RNG = random.Random()
H100 = clusters.load("h100-sxm")


def _moe():
    """tiny-qwen3-moe with a fresh width, expert count and top-k (every layer MoE)."""
    experts = RNG.choice([8, 16])
    return replace(load("tiny-qwen3-moe"), hidden=RNG.choice([64, 128]), experts=experts,
                   experts_per_tok=RNG.choice([1, 2, 4]))


def _step(cfg, world, nodes, policy, seq_len):
    setup = make_setup(H100, cfg, seq_len, None, world, nodes)
    attn = setup.attention(1, "local", {}, "contiguous")
    return step(setup, world, 1, attn, policy), setup


@pytest.mark.parametrize(("world", "nodes", "size"), [(4, 1, 4), (4, 2, 4), (8, 2, 2)])
def test_all_to_all_bytes_are_the_pairs_sent_times_hidden_by_link(world, nodes, size):
    cfg = _moe()
    n = RNG.choice([512, 1024, 2048])
    s, setup = _step(cfg, world, nodes, Policy("dp_sp", "none", ep=size), n)
    elem = 2
    # each rank's n tokens, k pairs each, (ep - 1)/ep of them to another member; four a step
    # (dispatch and combine, forward and backward) under no recompute, every layer MoE
    each = n * cfg.experts_per_tok * (size - 1) / size * cfg.hidden * elem
    total = 4 * cfg.layers * each
    per_node = world // nodes
    apart = 0 if size <= per_node else size - per_node  # members on the other node
    assert s.ep_bytes["inter"] == pytest.approx(total * apart / (size - 1), rel=1e-6)
    assert s.ep_bytes["intra"] + s.ep_bytes["inter"] == pytest.approx(total, rel=1e-6)
    assert s.parts["ep_comm"] > 0
    full = step(setup, world, 1, s.attention, Policy("dp_sp", "full", ep=size))
    assert sum(full.ep_bytes.values()) == pytest.approx(1.5 * total, rel=1e-6)  # forward again
    none = step(setup, world, 1, s.attention, Policy("dp_sp", "none"))
    assert none.ep_bytes == {} and none.parts["ep_comm"] == 0


def test_experts_held_and_gathered_by_their_ep_share():
    cfg = _moe()
    size = RNG.choice([2, 4])
    whole, _ = _step(cfg, 4, 1, Policy("replicated", "full"), 1024)
    split, _ = _step(cfg, 4, 1, Policy("replicated", "full", ep=size), 1024)
    share = expert_share(cfg)
    assert split.memory["states"] == pytest.approx(
        whole.memory["states"] * (1 - share * (1 - 1 / size)), rel=1e-6)
    fsdp, _ = _step(cfg, 4, 1, Policy("dp_sp", "full"), 1024)
    fsdp_ep, _ = _step(cfg, 4, 1, Policy("dp_sp", "full", ep=size), 1024)
    assert fsdp_ep.memory["states"] == fsdp.memory["states"]  # E/ep experts over world/ep ranks
    routed = routed_numel(cfg, 0)
    gathered = gathered_bytes(layer_numel(cfg, 0) - routed + routed // size, "bfloat16",
                              Policy().train("bfloat16"))
    buffers = 2 * 1024 * cfg.experts_per_tok * cfg.hidden * 2  # the pairs in, the outputs out
    buffers += comm_buffer_bytes(1 + (size < 4))  # NCCL's: the EP group, the experts' shards
    assert fsdp_ep.memory["transient"] - fsdp.memory["transient"] == pytest.approx(
        gathered - gathered_bytes(layer_numel(cfg, 0), "bfloat16", Policy().train("bfloat16"))
        + buffers, abs=2)


def test_ep_is_searched_for_a_mixture_of_experts_only():
    assert ep.degrees(load("tiny"), 8, 8) == (1,)
    assert ep.degrees(load("tiny-qwen3-moe"), 8, 4) == (1, 2, 4, 8)
    assert ep.degrees(load("tiny-qwen3-moe"), 12, 4) == (1, 2, 4)  # 12 places no group of 8
    dense = search(make_setup(H100, "tiny", 4096, None, 4, 1), Filters(sp=1), keep=None)
    assert {s.policy.ep for s in dense.ranked} == {1}
    moe = search(make_setup(H100, "tiny-qwen3-moe", 4096, None, 4, 1), Filters(sp=1), keep=None)
    assert {s.policy.ep for s in moe.ranked} == {1, 2, 4}
    with_ep = [s.policy for s in moe.ranked if s.policy.ep > 1]
    assert {p.states for p in with_ep} == {"dp_sp", "replicated"}
    # what the runner trains with EP (model.ep.check): no sequence modes, tiles, states offload
    assert {p.checkpoint for p in with_ep} == set(ep.EP_CHECKPOINTS)
    assert not any(p.tiled or set(p.offload) - {"activations"} for p in with_ep)
    assert all(s.json()["ep"] == s.policy.ep for s in moe.ranked)
    pinned = search(make_setup(H100, "tiny-qwen3-moe", 4096, None, 4, 1, ep=2),
                    Filters(sp=1, ep=2), keep=None)
    assert {s.policy.ep for s in pinned.ranked} == {2}


@pytest.mark.parametrize(("model", "size", "world", "said"), [
    ("tiny", 2, 4, "needs a mixture of experts"),
    ("tiny-qwen3-moe", 3, 6, "must divide the model's routed experts (8)"),
    ("tiny-qwen3-moe", 8, 12, "must divide the ranks (DP x SP = 12)"),
])
def test_bad_ep_is_one_line(model, size, world, said):
    with pytest.raises(ConfigError) as err:
        make_setup(H100, model, 4096, None, world, 1, ep=size)
    assert f"ep={size}" in str(err.value) and said in str(err.value)
    assert "\n" not in str(err.value)


def test_states_without_ep_and_a_bad_skew_are_one_line():
    with pytest.raises(ConfigError, match="states='zero1': does not hold experts"):
        Filters(states="zero1", ep=2)
    for pin, said in (({"tiled": True}, "tiled=True: not with ep 2"),
                      ({"checkpoint": "seq:0.5"}, "checkpoint='seq:0.5': with ep 2 must be one of"),
                      ({"offload": ("optimizer", "params")}, "offload='optimizer,params'")):
        with pytest.raises(ConfigError, match=said.replace("(", "\\(")):
            ep.check_filters(Filters(ep=2, **pin))
    ep.check_filters(Filters(ep=1, tiled=True))
    with pytest.raises(ConfigError, match="routing-skew=0.5: must be at least 1"):
        make_setup(H100, "tiny-qwen3-moe", 4096, None, 4, 1, routing_skew=0.5)


def test_skew_slows_the_busiest_rank_s_experts_and_all_to_alls():
    cfg = load("qwen3-30b-a3b")
    policy = Policy("dp_sp", "none", ep=16)
    skew = RNG.uniform(1.1, 2.0)
    even = make_setup(H100, cfg, 16384, None, 16, 2)
    skewed = make_setup(H100, cfg, 16384, None, 16, 2, routing_skew=skew)
    attn = even.attention(1, "local", {}, "contiguous")
    a, b = step(even, 16, 1, attn, policy), step(skewed, 16, 1, attn, policy)
    assert sum(b.ep_bytes.values()) == pytest.approx(skew * sum(a.ep_bytes.values()), rel=1e-6)
    assert b.parts["ep_comm"] > a.parts["ep_comm"]
    assert b.parts["other_compute"] > a.parts["other_compute"]  # the busiest rank's experts
    assert b.step_ms > a.step_ms
