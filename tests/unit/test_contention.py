"""What ranks sharing a host's cores cost one another (`planner.contention`): the spread of a
balanced stage, hidden where the busiest rank has more work than the rest, and the transport
threads' CPU, hidden in the others' slack; nothing on a GPU cluster."""

from __future__ import annotations

import pytest

from seqpar.planner import clusters, contention
from seqpar.planner.policy import Policy
from seqpar.planner.search import Setup
from seqpar.planner.step import _blocks, head_time, layer_kinds, step
from seqpar.rules.model import load

LOCAL = clusters.load("local").model_copy(update={"spread": {}, "transport_cpu_us": {}})


def _parts(cluster, algorithm: str, layout: str, sp: int = 2):
    setup = Setup(cluster, load("tiny"), 1024, None, sp, 1, "float32", 1, "flash2")
    attn = setup.attention(sp, algorithm, {}, layout)
    policy = Policy("replicated", "none")
    train = policy.train("float32")
    blocks = _blocks(setup, 1, sp, attn, policy, train, layer_kinds(setup, sp, attn))
    return setup, attn, policy, train, blocks, head_time(setup, sp)


def test_imbalance_is_the_layouts_for_a_ring_and_none_for_heads_or_linear_layers():
    setup, attn, *_ = _parts(LOCAL, "ring", "contiguous")
    # causal, two ranks, contiguous: rank 1 sees 3/4 of the 1024 x 1025 / 2 pairs
    assert contention.attention_imbalance(setup, 2, attn, "full") == pytest.approx(
        2 * (512 * 512 + 512 * 513 / 2) / (1024 * 1025 / 2))
    assert contention.attention_imbalance(setup, 2, attn, "linear") == 1.0
    setup, attn, *_ = _parts(LOCAL, "ring", "zigzag")
    assert contention.attention_imbalance(setup, 2, attn, "full") == pytest.approx(1.0)
    setup, attn, *_ = _parts(LOCAL, "ulysses", "contiguous")
    assert contention.attention_imbalance(setup, 2, attn, "full") == 1.0


def test_a_balanced_stage_pays_the_spread_an_unbalanced_ring_hides_it():
    cluster = LOCAL.model_copy(update={"spread": {2: 0.2, 4: 0.5}})
    assert contention.spread(cluster, 3) == 0.2 and contention.spread(cluster, 8) == 0.5
    setup, attn, _, train, blocks, head = _parts(cluster, "ulysses", "contiguous")
    work = sum(b.count * (b.kernels + b.other + b.recompute) for b in blocks) + head
    got = contention.micro_seconds(setup, 2, 2, attn, train, blocks, head)
    assert got == pytest.approx(0.2 * work)
    # the ring's rank 1 does 1.5x the mean's attention: 1.2 x the mean is still under it
    setup, attn, _, train, blocks, head = _parts(cluster, "ring", "contiguous")
    got = contention.micro_seconds(setup, 2, 2, attn, train, blocks, head)
    assert got == pytest.approx(0.2 * (sum(b.count * (b.other + b.recompute) for b in blocks)
                                       + head))


def test_the_transport_threads_cpu_is_hidden_in_the_other_ranks_slack():
    cluster = LOCAL.model_copy(update={"transport_cpu_us": {2: (100.0, 300.0)}})
    setup, attn, _, train, blocks, head = _parts(cluster, "ulysses", "contiguous")
    balanced = contention.micro_seconds(setup, 2, 2, attn, train, blocks, head)
    assert balanced > 0  # no rank idles: the threads take it from the compute
    assert balanced == pytest.approx(contention._transport(setup, 2, 2, attn, train))
    setup, attn, _, train, blocks, head = _parts(cluster, "ring", "contiguous")
    slack = sum(b.count * b.kernels * (1 - 1 / 1.4995) for b in blocks)
    cpu = contention._transport(setup, 2, 2, attn, train)
    got = contention.micro_seconds(setup, 2, 2, attn, train, blocks, head)
    assert got == pytest.approx(max(0.0, cpu - slack), abs=1e-4 * cpu)


def test_the_step_adds_it_to_the_host_part_and_a_gpu_cluster_has_none():
    measured = LOCAL.model_copy(update={"spread": {2: 0.15}, "transport_cpu_us": {2: (80., 300.)}})
    setup, attn, policy, train, blocks, head = _parts(measured, "ulysses", "contiguous")
    extra = contention.micro_seconds(setup, 2, 2, attn, train, blocks, head)
    with_it = step(setup, 1, 2, attn, policy)
    plain_setup, plain_attn, *_ = _parts(LOCAL, "ulysses", "contiguous")
    plain = step(plain_setup, 1, 2, plain_attn, policy)
    assert with_it.step_ms == pytest.approx(plain.step_ms + 1e3 * extra * with_it.micro_batches)
    assert with_it.parts["host"] == pytest.approx(plain.parts["host"] + 1e3 * extra)
    gpu = clusters.load("h100-sxm").model_copy(update={"spread": {2: 0.15}})
    setup, attn, _, train, blocks, head = _parts(gpu, "ulysses", "contiguous")
    assert contention.micro_seconds(setup, 2, 2, attn, train, blocks, head) == 0.0
