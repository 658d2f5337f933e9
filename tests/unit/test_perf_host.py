"""The performance model on a host whose ranks share its cores (this machine, `seqpar calibrate`):
cores shared out, work beside the kernel, the host transport's own cost, fixed host costs; and the
calibration that measures them."""

from __future__ import annotations

import dataclasses
import functools
import importlib

import pytest

from seqpar import planner
from seqpar.algorithms.base import AttnShape
from seqpar.planner import clusters, kernel
from seqpar.planner import schedule as schedule_module
from seqpar.planner.clusters import ADD_PASSES, MEMORY_EFFICIENCY, MERGE_PASSES, Cluster, Link
from seqpar.sweeps.calibrate import compute as calibrate

FREE = Link(bandwidth_gb_per_s=1e9, latency_us=0.0)
SHAPE = AttnShape(1, 1024, 8, 8, 32, 4)


def host(**update) -> Cluster:
    """A host like this machine's with free links and no work beside the kernel unless asked."""
    base = Cluster(name="host", attention_tflops={"float32": 0.04}, gemm_tflops={"float32": 0.1},
                   kernel_half_tokens=0, memory_gb=16, intra=FREE, inter=FREE, cores=2,
                   merge_gb_per_s=1e9, copy_gb_per_s=1e9)
    return base.model_copy(update=update)


def ms(cluster: Cluster, name: str, world: int, layout: str = "zigzag", **options) -> float:
    return planner.predict(cluster, name, SHAPE, world, options=options, layout=layout,
                        dtype="float32").attention_ms


def test_ranks_beyond_the_cores_share_them():
    """Balanced ring: 4 ranks on 2 cores take twice what 4 devices take; 2 ranks on 2 cores and 4
    on 4 cores run as devices do."""
    alone = ms(host(cores=None), "ring", 4)
    assert ms(host(cores=2), "ring", 4) == pytest.approx(2 * alone, rel=1e-9)
    assert ms(host(cores=4), "ring", 4) == pytest.approx(alone, rel=1e-9)
    assert ms(host(cores=2), "ring", 2) == pytest.approx(ms(host(cores=None), "ring", 2), rel=1e-9)


def test_an_unbalanced_step_is_bounded_by_its_busiest_rank_and_by_the_cores():
    """Contiguous causal ring: the busiest rank works alone while the others idle, so sharing 2
    cores costs less than twice the device time, but at least all ranks' work over 2 cores."""
    alone = ms(host(cores=None), "ring", 4, "contiguous")
    shared = ms(host(cores=2), "ring", 4, "contiguous")
    balanced_total = ms(host(cores=None), "ring", 4, "zigzag") * 4 / 2
    assert alone < shared < 2 * alone
    assert shared >= balanced_total * 0.99


def test_one_rank_on_a_host_runs_one_thread():
    """A CPU trial's rank runs one thread whatever the cores (platform.cluster.start_gang), so P=1
    on an 8-core host takes what one core takes."""
    assert ms(host(cores=8), "local", 1) == pytest.approx(ms(host(cores=None), "local", 1))
    assert host(cores=8).share(1) == 1.0 and host(cores=2).share(8) == 0.25


def test_fixed_host_costs_add_once_per_step_collective_and_call():
    base = host(cores=None)
    ring, ulysses = ms(base, "ring", 4), ms(base, "ulysses", 4)
    step = base.model_copy(update={"step_us": 100.0})
    assert ms(step, "ring", 4) - ring == pytest.approx(2 * 4 * 0.1, rel=1e-6)  # 4 steps fwd + bwd
    assert ms(step, "ulysses", 4) == pytest.approx(ulysses)  # no ring
    coll = base.model_copy(update={"collective_us": 100.0})
    assert ms(coll, "ulysses", 4) - ulysses == pytest.approx(4 * 0.1, rel=1e-6)  # four all-to-alls
    call = base.model_copy(update={"call_us": 300.0})
    assert ms(call, "local", 1) - ms(base, "local", 1) == pytest.approx(0.3, rel=1e-6)


def test_host_transport_costs_the_ranks_time_only_when_it_runs_on_them():
    """gloo over loopback moves bytes with the ranks' cores: each ring step sends and receives its
    message. A GPU's links (transport_gb_per_s None) cost nothing beside the link."""
    base = host(cores=None)
    ring = ms(base, "ring", 2)
    slow = base.model_copy(update={"transport_gb_per_s": 0.01, "message_us": 50.0})
    msg = 2 * 8 * SHAPE.unit(2)  # K,V of one rank (and, float32, its dK,dV)
    # forward: step 0 sends and receives K,V; backward: step 0 K,V and dK,dV, step 1 dK,dV (home)
    moved, messages = 2 * msg + 2 * (msg + msg) + 2 * msg, 2 + 4 + 2
    expect = moved / 0.01e9 + messages * 50e-6
    assert ms(slow, "ring", 2) - ring == pytest.approx(1e3 * expect, rel=1e-6)
    assert ms(base.model_copy(update={"message_us": 50.0}), "ring", 2) == pytest.approx(ring)


def test_gpu_merge_and_copy_rates_come_from_memory_bandwidth():
    a100 = clusters.load("loongtrain-a100")
    assert a100.memory_gb_per_s == 2039.0
    rate = MEMORY_EFFICIENCY * 2039e9
    assert a100.merge_seconds(1e9) == pytest.approx(1e9 * MERGE_PASSES / rate)
    assert a100.copy_seconds(1e9) == pytest.approx(1e9 * ADD_PASSES / rate)
    assert a100.transport_seconds(1e9, 10) == 0.0  # NVLink/NCCL: no host transport
    measured = a100.model_copy(update={"merge_gb_per_s": 2.0, "merge_us": 10.0})
    assert measured.merge_seconds(1e9, calls=3) == pytest.approx(0.5 + 3e-5)


def test_a_measured_kernel_table_sets_each_calls_rate():
    """calibrate's table by mask and size: interpolated in log(tokens), held at its ends; causal
    and shifted calls read the causal row, full calls the full row."""
    c = host(attention_tflops_by_block={"causal": {256: 0.01, 1024: 0.03},
                                        "full": {256: 0.02, 1024: 0.04}})
    assert c.call_rate("float32", 512, "causal") == pytest.approx(0.02e12)
    assert c.call_rate("float32", 512, "shifted") == pytest.approx(0.02e12)
    assert c.call_rate("float32", 512, "full") == pytest.approx(0.03e12)
    assert c.call_rate("float32", 64, "full") == pytest.approx(0.02e12)
    assert c.call_rate("float32", 8192, "causal") == pytest.approx(0.03e12)
    assert host(kernel_half_tokens=100).call_rate("float32", 100, "full") == pytest.approx(0.02e12)
    slow_causal = c.model_copy(update={"attention_tflops_by_block": {
        "causal": {256: 0.001, 1024: 0.001}, "full": {256: 0.02, 1024: 0.04}}})
    assert ms(slow_causal, "local", 1) > 5 * ms(c, "local", 1)  # one causal call


def test_a_measured_time_by_head_dim_sets_the_kernels_rate_at_other_dims():
    """Half the dim at 0.7 of the time runs at 0.5/0.7 of the table's rate; between two measured
    dims the time is interpolated, beyond them it grows with the dim; no table: the FLOPs' rate."""
    from seqpar.planner.kernel import dim_rate

    c = host(attention_time_by_dim={16: 0.7, 32: 1.0, 64: 1.8})
    assert dim_rate(c, 32) == pytest.approx(1.0)
    assert dim_rate(c, 16) == pytest.approx(0.5 / 0.7)
    assert dim_rate(c, 48) == pytest.approx(1.5 / 1.4)
    assert dim_rate(c, 128) == pytest.approx(dim_rate(c, 64)) == pytest.approx(2 / 1.8)
    assert dim_rate(c, 8) == pytest.approx(dim_rate(c, 16))
    assert dim_rate(host(), 16) == 1.0
    # a table measured at 16 whose 32 takes 1.4x the time: SHAPE's 32 dims run 2/1.4 as fast
    faster = host(cores=None, attention_time_by_dim={16: 1.0, 32: 1.4})
    assert ms(faster, "local", 1) == pytest.approx(ms(host(cores=None), "local", 1) / (2 / 1.4),
                                                   rel=0.02)


def test_merges_and_accumulation_add_to_ring_compute():
    cheap, dear = host(cores=None), host(cores=None, merge_gb_per_s=0.1, copy_gb_per_s=0.1)
    fwd = [planner.predict(c, "ring", SHAPE, 4, dtype="float32").forward_ms for c in (cheap, dear)]
    whole = [ms(c, "ring", 4) for c in (cheap, dear)]
    assert fwd[1] > fwd[0] * 1.5 and whole[1] - fwd[1] > whole[0] - fwd[0]


@pytest.mark.parametrize("world", [16, 256])
def test_a_ring_costs_each_kind_of_block_once_whatever_its_size(world):
    """plan at P=1024 stays fast: a ring's blocks are costed once per kind (a rank's own block, an
    earlier one, a later one), not once per (position, source) pair; rings that meet the same
    blocks are evaluated once."""
    calls = []
    real = kernel.block_seconds

    def counting(*args, **kw):
        calls.append(args)
        return real(*args, **kw)

    a100 = clusters.load("loongtrain-a100")
    shape = AttnShape(1, 64 * world, 32, 32, 128, 2)
    predict_module = importlib.import_module("seqpar.planner.job")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kernel, "block_seconds", counting)
        mp.setattr(predict_module, "_SHARED", {})
        planner.predict(a100, "ring", shape, world, nodes=2)
        assert len(calls) == 3  # forward and backward meet the same three blocks
        planner.predict(a100, "double_ring", shape, world, nodes=2, options={"inner_ring": 4})
        assert len(calls) == 3  # the double ring met the ring's blocks: none computed again
        calls.clear()
        planner.predict(a100, "usp", shape, world, nodes=2, options={"dhp": 4})
        assert len(calls) == 3


@pytest.mark.parametrize(("name", "options"), [("usp", {"dhp": 2}), ("burst", {}),
                                               ("double_ring", {"inner_ring": 2}), ("ring", {})])
def test_rings_marked_same_blocks_do_meet_the_same_blocks(name, options):
    """The shortcut is exact: evaluating every ring gives the same prediction."""
    a100 = clusters.load("loongtrain-a100")
    shape = AttnShape(1, 65536, 32, 32, 128, 2)
    fast = planner.predict(a100, name, shape, 8, nodes=2, options=options, layout="contiguous")
    real = schedule_module.schedule

    def every_ring(*args, **kw):
        s = real(*args, **kw)
        for phase, stages in s.phases.items():
            s.phases[phase] = [dataclasses.replace(st, same_blocks=False)
                               if isinstance(st, schedule_module.RingStage) else st for st in stages]
        return s

    with pytest.MonkeyPatch.context() as mp:
        predict_module = importlib.import_module("seqpar.planner.predict")
        mp.setattr(predict_module, "schedule", every_ring)
        slow = planner.predict(a100, name, shape, 8, nodes=2, options=options, layout="contiguous")
    assert slow.attention_ms == pytest.approx(fast.attention_ms, rel=1e-12)


# --------------------------------------------------------------------------- calibration
def test_fit_line_recovers_a_line():
    assert calibrate.fit_line({1.0: 5.0, 2.0: 7.0, 4.0: 11.0}) == pytest.approx((3.0, 2.0))


def test_fixed_costs_recover_what_the_tiny_cases_spent():
    """Calibration's residuals: tiny cases whose CPU is what the model says for known fixed costs
    give those costs back."""
    known = host(cores=2, call_us=900.0, step_us=400.0, collective_us=250.0, merge_us=60.0,
                 transport_gb_per_s=3.0, message_us=80.0)
    free = known.model_copy(update={"cores": None})
    shape = AttnShape(1, calibrate.STEP_TOKENS, calibrate.HEADS, calibrate.HEADS,
                      calibrate.HEAD_DIM, 4)
    tiny = {name: planner.predict(free, name, shape, 1 if name == "local" else 2, layout="contiguous",
                               dtype="float32").attention_ms / 1e3 for name in calibrate.TINY}
    found = calibrate.fixed_costs(known.model_copy(
        update={"call_us": 0.0, "step_us": 0.0, "collective_us": 0.0}), tiny)
    assert (found.call_us, found.step_us, found.collective_us) == pytest.approx(
        (900.0, 400.0, 250.0), abs=0.2)


def test_cores_are_the_ones_this_process_may_use(monkeypatch):
    monkeypatch.setattr(calibrate.os, "sched_getaffinity", lambda _pid: {0, 2, 5}, raising=False)
    assert calibrate.cores() == 3


def test_calibrate_without_links_measures_this_thread(tmp_path, monkeypatch):
    """`seqpar calibrate --no-links`: kernel, merge and copy rates of one thread, and the cores
    (on blocks of up to 512 tokens: the command's path, in a second rather than 17)."""
    from typer.testing import CliRunner

    from seqpar.cli.app import app

    monkeypatch.setattr(calibrate, "kernel_rates", functools.partial(
        calibrate.kernel_rates, blocks=(64, 128, 256, 512), sweeps=1))
    monkeypatch.setattr(calibrate, "head_dim_times", functools.partial(
        calibrate.head_dim_times, dims=(16, 32, 64), blocks=(256,), sweeps=1))

    out = tmp_path / "here.yaml"
    result = CliRunner().invoke(app, ["calibrate", "--no-links", "--out", str(out)])
    assert result.exit_code == 0, result.output
    c = clusters.load(str(out))
    assert c.cores == calibrate.cores()
    assert c.attention_tflops["float32"] > 0 and c.merge_gb_per_s > 0 and c.copy_gb_per_s > 0
    assert set(c.attention_tflops_by_block) == {"causal", "full"}
    assert all(r > 0 for rates in c.attention_tflops_by_block.values() for r in rates.values())
    # the time by head dim against the table's (32): more dims, more time; 1.0 at 32
    times = c.attention_time_by_dim
    assert times[32] == 1.0 and 0 < times[16] < times[64]
    assert 0 < c.probe_ms < 1e3  # the host's speed probe beside the rates (`measure.probe`)
    assert c.transport_gb_per_s is None  # no link measured: no host transport
