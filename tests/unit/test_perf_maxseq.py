"""`seqpar plan --max-seq`: the longest sequence each configuration fits, by the planner's memory."""

from __future__ import annotations

import json
import random

import pytest
from typer.testing import CliRunner

from seqpar import algorithms
from seqpar.cli.app import app
from seqpar.planner import clusters
from seqpar.planner.maxseq import max_seq, peak_at
from seqpar.planner.plan import model_shape

RNG = random.Random()


def _space(world: int, k: int) -> list:
    space = [(n, o) for n in algorithms.REGISTRY if n != "local"
             for o in algorithms.option_space(n, world)]
    return RNG.sample(space, min(k, len(space)))


@pytest.mark.parametrize("scope", ["attention", "model"])
def test_the_longest_sequence_fits_and_one_step_more_does_not(scope):
    world = RNG.choice([4, 8, 16])
    model = RNG.choice(["llama2-7b", "llama3-8b"])
    cluster = clusters.load(RNG.choice(["loongtrain-a100", "burst-a800", "wallfacer-h100"]))
    budget = cluster.memory_gb * 1e9
    found = max_seq(cluster, model, world, _space(world, 6), nodes=max(1, world // 8),
                    scope=scope)
    assert found and [r.max_tokens for r in found] == sorted((r.max_tokens for r in found),
                                                             reverse=True)
    for r in found:
        opts = dict(r.options)
        at = {"world": world, "options": opts, "nodes": max(1, world // 8), "policy": r.policy}
        assert (r.policy is None) == (scope == "attention")
        assert r.max_tokens % r.granularity == 0
        if r.max_tokens:
            algorithms.check(r.algorithm, model_shape(model, r.max_tokens)[0], world, r.layout,
                             True, **opts)  # a length the configuration accepts
            assert r.peak_mem_bytes == peak_at(r.algorithm, model, r.max_tokens, **at) <= budget
        assert peak_at(r.algorithm, model, r.max_tokens + r.granularity, **at) > budget


def test_more_memory_never_gives_a_shorter_sequence():
    world = RNG.choice([8, 16])
    base = clusters.load("loongtrain-a100")
    space = _space(world, 8)
    sizes = sorted(RNG.uniform(20, 200) for _ in range(3))
    runs = [{(r.algorithm, json.dumps(r.options), r.layout): r.max_tokens
             for r in max_seq(base.model_copy(update={"memory_gb": gb}), "llama2-7b", world,
                              space, nodes=2)} for gb in sizes]
    for small, big in zip(runs, runs[1:], strict=False):
        assert small.keys() == big.keys()
        assert all(big[k] >= small[k] for k in small)
    assert any(runs[-1][k] > runs[0][k] for k in runs[0])


def test_plan_max_seq_json_and_table():
    args = ["plan", "--cluster", "burst-a800", "--model", "llama2-7b", "--world", "8", "--max-seq"]
    out = json.loads(CliRunner().invoke(app, [*args, "--json"]).output)
    assert out["memory_gb"] == 80
    configs = out["configs"]
    assert {c["algorithm"] for c in configs} >= {"ring", "ulysses", "usp", "burst", "wallfacer"}
    assert all(set(c) == {"algorithm", "options", "layout", "max_tokens", "granularity",
                          "peak_mem_bytes"} for c in configs)
    model = json.loads(CliRunner().invoke(app, [*args, "--scope", "model", "--algorithm", "ring",
                                                "--checkpoint", "full", "--json"]).output)
    assert model["configs"] and all(
        set(c) == {"algorithm", "options", "layout", "states", "checkpoint", "fused_head",
                   "offload", "tiled", "ep", "max_tokens", "granularity", "peak_mem_bytes"}
        and c["checkpoint"] == "full" and c["offload"] == [] and c["tiled"] is False
        for c in model["configs"])
    assert all(0 < c["peak_mem_bytes"] <= 80e9 for c in configs if c["max_tokens"])
    table = CliRunner().invoke(app, [*args, "--top", "3"])
    assert table.exit_code == 0 and f"{configs[0]['max_tokens']:,}" in table.output


def test_activation_offload_and_tiling_lengthen_the_longest_sequence():
    """Llama-3.1-8B on 8 H100 80 GB: offloading activations and tiling the MLP and loss (ALST)
    fit longer sequences than the same policy without them, never shorter ones."""
    from seqpar.planner.policy import Filters

    cluster = clusters.load("h100-sxm")
    space = [("ulysses", {}), ("ring", {})]

    def longest(offload, tiled):
        f = Filters(states="dp_sp", checkpoint="full", fused_head=True, offload=offload,
                    tiled=tiled)
        return {(r.algorithm, r.layout): r.max_tokens
                for r in max_seq(cluster, "llama3.1-8b", 8, space, scope="model", filters=f)}

    plain, tiled, both = longest((), False), longest((), True), longest(("activations",), True)
    assert plain.keys() == tiled.keys() == both.keys()
    assert all(plain[k] <= tiled[k] <= both[k] for k in plain)
    assert all(both[k] > 1.5 * plain[k] for k in plain)
