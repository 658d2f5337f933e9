"""The performance model: one fact checked (a schedule's bytes are the algorithm's analytic bytes),
the papers' worked numbers, and the structure (overlap, contention, layout imbalance, memory)."""

from __future__ import annotations

import pytest

from seqpar import algorithms, planner
from seqpar.algorithms.base import AttnShape
from seqpar.planner import clusters, memory
from seqpar.planner.schedule import P2P, Collective, RingStage, phase_bytes, schedule

GIB = 2 ** 30
A100 = clusters.load("loongtrain-a100")

CASES = [
    ("local", 1, {}), ("allgather", 4, {}), ("ulysses", 4, {}), ("ulysses", 8, {}),
    ("ring", 4, {}), ("ring", 8, {}), ("burst", 8, {}), ("burst", 8, {"ranks_per_node": 4}),
    ("double_ring", 8, {"inner_ring": 2}), ("usp", 8, {"dhp": 2}),
    ("usp", 8, {"dhp": 4, "placement": "context-first", "inner_ring": 1}),
    ("wallfacer", 4, {"team_size": 1}), ("wallfacer", 4, {"team_size": 2}),
    ("wallfacer", 16, {"team_size": 2, "placement": "p2p-intra"}),
    ("wallfacer", 16, {"team_size": 4}),
    ("ring", 4, {"grad_dtype": "input"}), ("burst", 4, {"grad_dtype": "input"}),
    ("wallfacer", 4, {"team_size": 2, "grad_dtype": "input"}),
    ("usp", 8, {"dhp": 2, "grad_dtype": "input"}),
]


@pytest.mark.parametrize("kv_heads", [8, 2])
@pytest.mark.parametrize("elem", [4, 2])
@pytest.mark.parametrize(("name", "world", "options"), CASES, ids=[
    "-".join([n, str(w), *(f"{k}={v}" for k, v in o.items())]) for n, w, o in CASES])
def test_schedule_bytes_are_the_algorithms_bytes(name, world, options, kv_heads, elem):
    shape = AttnShape(2, 64 * world, 8, kv_heads, 16, elem)
    algorithms.check(name, shape, world, "zigzag", True, **options)
    assert phase_bytes(schedule(name, shape, world, options, nodes=2 if world > 1 else 1)) == \
        algorithms.expected_bytes(name, shape, world, **options)


@pytest.mark.parametrize(("name", "options"), [("burst", {}), ("wallfacer", {"team_size": 2})])
def test_query_ring_gradient_follows_grad_dtype(name, options):
    """A bf16 plan with grad_dtype="input" sends dq in bf16: half the default (fp32) bytes."""
    shape = AttnShape(1, 1024, 8, 8, 32, 2)

    def dq(**extra):
        (ring,) = [st for st in schedule(name, shape, 4, {**options, **extra}).phases["backward"]
                   if isinstance(st, RingStage)]
        return ring.grad

    assert dq(grad_dtype="input") * 2 == dq() == dq(grad_dtype="accumulate")


def test_every_registered_algorithm_has_a_schedule():
    shape = AttnShape(1, 64, 8, 8, 16, 4)
    for name in algorithms.REGISTRY:
        world = 1 if name == "local" else 4
        assert phase_bytes(schedule(name, shape, world, {})) == \
            algorithms.expected_bytes(name, shape, world)


def _stage(sched, phase, kind):
    return [st for st in sched.phases[phase] if isinstance(st, kind)]


def test_wallfacer_worked_volumes():
    """WallFacer §4.2.2, model M (llama-30B: hidden 6656 = 52 x 128, N = 64K, P = 64, C = 4,
    bf16): ring P2P 1.625 GB; WallFacer 0.406 GB P2P + 0.152 GB collective = 0.558 GB."""
    world, c = 64, 4
    bf16 = AttnShape(1, 65536, 52, 52, 128, 2)
    ring = algorithms.expected_bytes("ring", bf16, world)["forward"] * world / (world - 1)
    assert ring / GIB == pytest.approx(1.625, abs=5e-4)  # the paper counts P steps, we send P - 1
    wf = schedule("wallfacer", bf16, world, {"team_size": c})
    p2p = sum(st.nbytes for st in _stage(wf, "forward", RingStage) + _stage(wf, "forward", P2P))
    assert p2p / GIB == pytest.approx(0.406, abs=5e-4)
    # Eq. 6 counts q, k, v and out in the input dtype; we combine out (and lse) in fp32, so compare
    # elements with fp32 inputs: 4BNH(C-1)/P elements (+ the lse, 1/512 of it)
    fp32 = AttnShape(1, 65536, 52, 52, 128, 4)
    coll = sum(st.nbytes for st in _stage(schedule("wallfacer", fp32, world, {"team_size": c}),
                                          "forward", Collective)) / 4
    assert coll * 2 / GIB == pytest.approx(0.152, rel=0.01)
    assert (p2p + coll * 2) / GIB == pytest.approx(0.558, abs=2e-3)


def test_wallfacer_memory_eq_9_10():
    """Eq. 9-10 for model M (64 layers, C = 4): ring M + 68A, WallFacer M + 77A, +13.2%."""
    shape, layers = AttnShape(1, 65536, 52, 52, 128, 2), 64
    ring = layers + 1 + memory.held("ring", shape, 64, {})
    wall = layers + 1 + memory.held("wallfacer", shape, 64, {"team_size": 4})
    assert (ring, wall) == (68, 77)
    assert wall / ring - 1 == pytest.approx(0.132, abs=5e-4)


def test_burst_backward_message_3nd_2n_vs_4nd():
    """BurstEngine Alg. 1 vs 2: a backward ring step moves 4Nd (K, V, dK, dV) for ring and
    3Nd + 2N (Q, dQ, dO, D, lse) for burst; one head, fp32, so bytes / 4 are elements."""
    world, d = 4, 64
    shape = AttnShape(1, 4096, 1, 1, d, 4)
    n = shape.seq_len // world
    (ring,) = _stage(schedule("ring", shape, world, {}), "backward", RingStage)
    (burst,) = _stage(schedule("burst", shape, world, {}), "backward", RingStage)
    assert (ring.msg + ring.grad) // 4 == 4 * n * d
    assert (burst.msg + burst.grad) // 4 == 3 * n * d + 2 * n


@pytest.mark.parametrize(("kv_heads", "dhp"), [(32, 8), (32, 1), (8, 16), (8, 4)])
def test_loongtrain_4_5_volumes(kv_heads, dhp):
    """LoongTrain §4.5.3-4.5.4 (fp16, D = hidden = 4096, H = 32, dsp = 64, S = 128K):
    Size(kv) = max(Hkv, dhp)/H x 4SD/dsp per P2P message, and per phase
    AlltoAll_Volume = (Size(q) + Size(k) + Size(v) + Size(out)) x (dhp - 1)/dhp, Size(q) = 2SD/dsp
    (K, V after replication: max(Hkv, dhp)/H of Size(q))."""
    s, hidden, heads, world = 131072, 4096, 32, 64
    shape = AttnShape(1, s, heads, kv_heads, hidden // heads, 2)
    sched = schedule("usp", shape, world, {"dhp": dhp})
    (ring,) = _stage(sched, "forward", RingStage)
    size_q = 2 * s * hidden // world
    size_kv = max(kv_heads, dhp) * 4 * s * hidden // (heads * world)
    assert ring.msg == (size_kv if dhp < world else 0)
    kv_each = size_q * max(kv_heads, dhp) // heads
    volume = (2 * size_q + 2 * kv_each) * (dhp - 1) // dhp
    for phase in ("forward", "backward"):
        assert sum(st.nbytes for st in _stage(sched, phase, Collective)) == volume


def test_overlap_first_and_last_steps_are_exposed():
    """A ring whose transfers are free still pays its compute; one whose compute is free pays
    P - 1 transfers forward and, backward, P - 1 steps of K,V + dK,dV plus the last dK,dV home
    (dK,dV travel in float32: twice the bf16 K,V message)."""
    shape = AttnShape(1, 8192, 8, 8, 64, 2)
    free_link = A100.model_copy(update={"intra": clusters.Link(bandwidth_gb_per_s=1e9,
                                                              latency_us=0)})
    p = planner.predict(free_link, "ring", shape, 8)
    assert p.attention_ms == pytest.approx(p.compute_ms, rel=1e-6)
    fast = A100.model_copy(update={"attention_tflops": {"bfloat16": 1e9},
                                   "kernel_half_tokens": 0, "memory_gb_per_s": 1e12})
    p = planner.predict(fast, "ring", shape, 8)
    msg = 2 * 8 * shape.unit(8)
    link = fast.intra
    expect = 7 * link.seconds(msg) + 7 * link.seconds(msg + 2 * msg) + link.seconds(2 * msg)
    assert p.attention_ms == pytest.approx(1e3 * expect, rel=1e-3)


def test_contention_on_shared_nics_slows_head_first():
    """LoongTrain Table 4: at dcp = 32 head-first puts two ring senders on one NIC."""
    shape = AttnShape(1, 131072, 32, 32, 128, 2)
    hf, cf = (planner.predict(A100, "usp", shape, 64, nodes=8, options={"dhp": 2, "placement": pl})
              for pl in ("head-first", "context-first"))
    assert hf.exposed_ms["inter"] > 1.8 * cf.exposed_ms["inter"]


def test_causal_imbalance_contiguous_vs_zigzag():
    shape = AttnShape(1, 65536, 8, 8, 128, 2)
    fast_links = A100.model_copy(update={"intra": clusters.Link(bandwidth_gb_per_s=1e9),
                                         "memory_gb_per_s": 1e12})  # the kernels alone
    contiguous, zigzag = (planner.predict(fast_links, "ring", shape, 8, layout=lay)
                          for lay in ("contiguous", "zigzag"))
    assert contiguous.compute_ms / zigzag.compute_ms == pytest.approx(2 * 8 / 9, rel=0.05)


def test_small_blocks_run_slower():
    shape = AttnShape(1, 16384, 8, 8, 128, 2)
    kernels = A100.model_copy(update={"memory_gb_per_s": 1e12})  # the kernels alone
    eager = kernels.model_copy(update={"kernel_half_tokens": 0})
    slow, ideal = planner.predict(kernels, "ring", shape, 64), planner.predict(eager, "ring", shape, 64)
    assert slow.compute_ms > 1.5 * ideal.compute_ms


def test_wallfacer_holds_3c_activations_and_memory_rises():
    shape = AttnShape(1, 65536, 32, 32, 128, 2)
    one, four = (planner.predict(A100, "wallfacer", shape, 64, options={"team_size": c}).peak_mem_bytes
                 for c in (1, 4))
    assert four > one


def test_checkpoint_policies_trade_memory_for_recompute():
    from seqpar.planner.policy import Policy
    from seqpar.planner.search import make_setup
    from seqpar.planner.step import step

    setup = make_setup(A100, "llama2-7b", 131072, 131072, 16, 2)
    p = setup.attention(16, "usp", {"dhp": 8}, "zigzag")
    none, full, scpp, half = (step(setup, 1, 16, p, Policy("dp_sp", ck))
                              for ck in ("none", "full", "sc++", "seq:0.5"))
    assert none.step_ms < half.step_ms < full.step_ms
    assert scpp.step_ms < full.step_ms  # SC++ does not recompute attention
    assert none.peak_mem_bytes > half.peak_mem_bytes > full.peak_mem_bytes
    assert full.peak_mem_bytes < scpp.peak_mem_bytes < none.peak_mem_bytes
    assert 0 < full.mfu < none.mfu < 1 and full.hfu > full.mfu  # hfu: recompute, 2.5x backward
    for s in (none, full, scpp, half):  # the step's parts are the whole step
        assert sum(s.parts.values()) == pytest.approx(s.step_ms, rel=1e-9)
    assert none.parts["recompute"] == 0 < scpp.parts["recompute"] < full.parts["recompute"]
