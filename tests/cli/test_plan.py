"""`seqpar plan`: the JSON shape of issue 11, fitting configurations ranked, unfit ones listed."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from seqpar.cli.app import app
from seqpar.rules.layouts import LAYOUTS
from tests.cli.plan_cli import plan_json
from tests.cli.plan_cli import plan_table as _table


def test_plan_json_shape_and_ranking():
    out = plan_json("--cluster", "loongtrain-a100", "--model", "llama2-7b", "--seq-len", "65536",
                    "--world", "8")
    assert out["cluster"] == "loongtrain-a100"
    configs = out["configs"]
    assert {c["algorithm"] for c in configs} >= {"ring", "ulysses", "usp", "burst", "wallfacer"}
    for c in configs:
        assert set(c) >= {"algorithm", "options", "layout", "predicted"}
        p = c["predicted"]
        assert set(p) == {"attention_ms", "step_ms", "bytes_intra", "bytes_inter",
                          "peak_mem_bytes", "mfu"}
        assert p["step_ms"] is None and p["mfu"] is None  # --scope attention
        assert isinstance(p["bytes_intra"], int) and isinstance(p["peak_mem_bytes"], int)
    times = [c["predicted"]["attention_ms"] for c in configs if c["fits"]]
    assert times == sorted(times)


def test_plan_lists_configurations_that_do_not_fit_after_the_ranked_ones():
    out = plan_json("--cluster", "loongtrain-a100", "--model", "llama2-7b", "--seq-len", "1310720",
                    "--world", "2", "--nodes", "1")
    fits = [c["fits"] for c in out["configs"]]
    assert True in fits and False in fits  # ring's in-flight K,V,dK,dV buffers tip it over 80 GB
    assert fits == sorted(fits, reverse=True)
    mem = 80e9
    for c in out["configs"]:
        assert c["fits"] == (c["predicted"]["peak_mem_bytes"] <= mem)


STEP_KEYS = {"dp", "sp", "algorithm", "options", "layout", "states", "checkpoint", "fused_head",
             "offload", "tiled", "ep", "kernel", "micro_batches", "predicted", "fits",
             "dominated_by"}
PARTS = {"attention", "attention_comm", "other_compute", "recompute", "exposed_comm", "optimizer",
         "host", "ep_comm"}


def _check_steps(out: dict, world: int, tokens: int, seq_len: int) -> list[dict]:
    configs = out["configs"]
    assert configs and out["kernel"] == "flash2"
    for c in configs:
        assert set(c) == STEP_KEYS
        assert c["dp"] * c["sp"] == world and c["micro_batches"] * c["dp"] * seq_len == tokens
        assert c["states"] in ("dp_sp", "sp", "node", "replicated", "zero1")
        assert isinstance(c["offload"], list)
        assert isinstance(c["fused_head"], bool) and isinstance(c["tiled"], bool)
        p = c["predicted"]
        assert set(p) >= {"step_ms", "tgs", "mfu", "mfu_unmasked_attention", "hfu",
                          "peak_mem_bytes", "parts_ms", "attention_layer_ms"}
        assert set(p["parts_ms"]) == PARTS
        assert abs(sum(p["parts_ms"].values()) - p["step_ms"]) < 0.02
        assert abs(p["tgs"] - tokens / (p["step_ms"] / 1e3 * world)) < 0.01 * p["tgs"]
        host = p["memory"]["host"] * world / out.get("nodes", 1)  # a node's offloaded bytes
        assert c["fits"] == (p["peak_mem_bytes"] <= out["memory_gb"] * 1e9 and (
            out["host_memory_gb"] is None or host <= out["host_memory_gb"] * 1e9))
    fits = [c["fits"] for c in configs]
    assert fits == sorted(fits, reverse=True)  # fitting ones first
    tgs = [c["predicted"]["tgs"] for c in configs if c["fits"]]
    assert tgs == sorted(tgs, reverse=True)
    return configs


def test_plan_model_scope_gives_each_configuration_its_own_fields():
    out = plan_json("--cluster", "burst-a800", "--model", "llama2-7b", "--seq-len", "131072",
                    "--world", "16", "--scope", "model")
    configs = _check_steps(out, 16, 131072, 131072)
    # one SP group over 2 nodes: states sharded over it, over each node, or not at all, or the
    # moments alone over it (zero1)
    assert {c["dp"] for c in configs} == {1}
    assert {c["states"] for c in configs} == {"dp_sp", "node", "replicated", "zero1"}
    best = configs[0]["predicted"]
    assert best["parts_ms"]["attention"] > 0.3 * best["step_ms"]
    assert 0 < best["mfu"] < 1


def test_plan_cluster_scope_searches_dp_x_sp_splits():
    tokens, seq_len = 8 * 65536, 65536
    out = plan_json("--cluster", "h100-sxm", "--model", "llama3.1-8b", "--seq-len",
                    str(seq_len), "--world", "16", "--nodes", "2", "--scope", "cluster",
                    "--tokens-per-step", str(tokens), "--top", "0")
    configs = _check_steps(out, 16, tokens, seq_len)
    # SP within a node or over whole nodes; DP takes the rest, with whole micro-batches
    assert [(s["dp"], s["sp"]) for s in out["splits"]] == [(8, 2), (4, 4), (2, 8), (1, 16)]
    assert {c["sp"] for c in configs} == {2, 4, 8, 16}
    assert {c["states"] for c in configs} == {"dp_sp", "sp", "node", "replicated", "zero1"}
    assert {tuple(c["offload"]) for c in configs} >= {(), ("activations",)}
    assert out["kernel_source"].startswith("flash2: FlashAttention-3 (Shah et al. 2024")


def test_plan_cluster_scope_filters_pin_a_configuration():
    out = plan_json("--cluster", "h100-sxm", "--model", "llama3.1-8b", "--seq-len", "32768",
                    "--world", "8", "--scope", "cluster", "--tokens-per-step", "262144", "--sp",
                    "2", "--algorithm", "ring", "--layout", "zigzag", "--states", "dp_sp",
                    "--checkpoint", "full", "--no-fused-head", "--offload", "none", "--no-tiled")
    (c,) = out["configs"]
    assert (c["dp"], c["sp"], c["algorithm"], c["layout"], c["states"], c["checkpoint"],
            c["fused_head"], c["offload"], c["tiled"], c["micro_batches"]) == \
        (4, 2, "ring", "zigzag", "dp_sp", "full", False, [], False, 2)


def test_plan_cluster_table_shows_where_time_goes_and_why_rows_lose(monkeypatch):
    out = _table(monkeypatch, "--cluster", "h100-sxm", "--model", "llama3.1-8b", "--seq-len",
                 "131072", "--world", "16", "--nodes", "2", "--scope", "cluster",
                 "--tokens-per-step", "1048576", "--top", "6")
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 120
    rows = [line for line in lines if re.match(r"\s*\d+\s+\d+x\d+\s", line)]
    assert len(rows) == 6 and " best " in rows[0]
    assert all("%:" in r or "ties #1" in r for r in rows[1:])  # +N%: the part that grew
    assert "at/ac/oc/rc/cm/op" in out and "kernel rates: flash2" in out


def test_plan_cluster_scope_says_when_nothing_fits_within_seconds():
    import time

    t0 = time.perf_counter()
    result = CliRunner().invoke(app, ["plan", "--cluster", "wallfacer-a100-16", "--model",
                                      "llama3.1-70b", "--seq-len", "1048576", "--world", "2",
                                      "--nodes", "1", "--scope", "cluster", "--tokens-per-step",
                                      "1048576"])
    assert result.exit_code == 0, result.output
    assert "nothing fits in the 40 GB (1e9 bytes) of device memory a GPU" in result.output
    assert re.search(r"the least memory found is \d+\.\d GB: dp=", result.output)
    assert time.perf_counter() - t0 < 10


def test_plan_kernel_changes_the_prediction_and_is_refused_where_absent():
    from seqpar.errors import ConfigError

    args = ["--cluster", "h100-sxm", "--model", "llama3.1-8b", "--seq-len", "65536", "--world",
            "8", "--algorithm", "ring", "--layout", "zigzag"]
    times = {k: plan_json(*args, "--kernel", k)["configs"][0]["predicted"]["attention_ms"]
             for k in ("flash3", "sdpa-cudnn", "flash2", "sdpa-flash", "sdpa-efficient")}
    assert list(times.values()) == sorted(times.values())  # FA3 Fig. 4-5's order on an H100
    result = CliRunner().invoke(app, ["plan", "--cluster", "loongtrain-a100", "--kernel",
                                      "flash3", "--json"])
    assert isinstance(result.exception, ConfigError)
    assert "Hopper only" in str(result.exception)


@pytest.mark.parametrize(("option", "value"), [
    ("--seq-len", "0"), ("--seq-len", "-5"), ("--world", "0"), ("--nodes", "0"),
    ("--nodes", "-1"), ("--tokens-per-step", "0"), ("--sp", "0"), ("--top", "-1")])
def test_plan_refuses_a_bad_number_in_one_line(option, value):
    from seqpar.errors import ConfigError

    result = CliRunner().invoke(app, ["plan", "--scope", "cluster", "--tokens-per-step",
                                      "131072", option, value, "--json"])
    assert isinstance(result.exception, ConfigError), result.output
    assert str(result.exception).startswith(f"{option.lstrip('-')}={value}") or \
        str(result.exception).startswith(f"{option.lstrip('-')}={int(value)}")
    assert "\n" not in str(result.exception)


def test_plan_validate_of_an_unknown_sweep_is_one_line_and_writes_nothing(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    store = tmp_path / "store"
    store.mkdir()
    seqpar = str(Path(sys.executable).with_name("seqpar"))
    run = subprocess.run([seqpar, "--tracking-uri",
                          f"sqlite:///{store / 'mlflow.db'}", "plan", "--validate", "0123abcd"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert run.stderr.strip().count("\n") == 0 and "holds no MLflow store" in run.stderr
    assert list(store.iterdir()) == []  # no store, no lock


def test_plan_bad_cluster_is_one_line():
    from seqpar.errors import ConfigError

    result = CliRunner().invoke(app, ["plan", "--cluster", "nope", "--json"])
    assert isinstance(result.exception, ConfigError)
    assert str(result.exception).startswith("cluster='nope': must be one of loongtrain-a100")


def test_tune_prune_keeps_exactly_the_models_top_k():
    from seqpar.sweeps.tune import predicted_ms, tuning_plan

    full = tuning_plan(4, "tiny", 1024, cluster="loongtrain-a100")
    times = predicted_ms(full.points, "loongtrain-a100")
    by_time = sorted(((times[id(p)], i, p.spec.hash) for i, p in enumerate(full.trials)))
    pruned = tuning_plan(4, "tiny", 1024, prune=3, cluster="loongtrain-a100")
    assert len(pruned.trials) == 3
    top = sorted(by_time[:3], key=lambda x: x[1])  # the model's top 3 (ties: space order)
    assert [p.spec.hash for p in pruned.trials] == [h for _, _, h in top]
    kept = {p.spec.hash for p in pruned.trials}
    worst_kept = max(t for t, _, h in by_time if h in kept)
    assert all(t >= worst_kept for t, _, h in by_time if h not in kept)


def test_validate_rebuilds_specs_from_flat_params_and_scores():
    from seqpar.experiments.registry import STUDIES
    from seqpar.experiments.spec import specs_of
    from seqpar.planner import clusters, predict_spec
    from seqpar.planner import plan as perf_plan

    local = clusters.load("local")
    trials = []
    for p in STUDIES["placement"].points("cpu"):
        if p.spec is None:
            continue
        params = {k: str(v) for k, v in p.spec.flat().items()}  # as MLflow stores them
        pred = predict_spec(p.spec, perf_plan.emulated(p.spec, local)).attention_ms
        trials.append((params, {"step_ms": pred * 1.1}))
    checks = perf_plan.validate(specs_of(trials), local)
    assert len(checks) == len(trials) >= 4
    s = perf_plan.summary(checks)
    assert abs(s["median_abs_error"] - (1 - 1 / 1.1)) < 1e-6
    assert s["max_regret"] == 0 and len(s["regret"]) == 1


def test_plan_table_merges_identical_configurations_and_fits_120_columns(monkeypatch):
    args = ("--cluster", "loongtrain-a100", "--model", "llama2-7b", "--seq-len", "262144",
            "--world", "32")
    out = _table(monkeypatch, *args, "--top", "8")
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 120
    rows = [line for line in lines if line[:4].strip().isdigit() and "configurations" not in line]
    assert len(rows) == 8
    ulysses = [r for r in rows if " ulysses " in r]
    assert len(ulysses) == 1 and " any " in ulysses[0]  # its layout: no change
    assert "step" not in out and "MFU" not in out  # empty in the attention scope
    assert any("ring=1|2|4" in r for r in rows)  # usp's inner rings that change nothing: one row
    configs = plan_json(*args)["configs"]
    assert f"{len(configs)} configurations in " in " ".join(lines)
    assert sum(c["algorithm"] == "ulysses" for c in configs) == len(LAYOUTS)  # --json: every one


def test_plan_rows_are_configurations_with_identical_predictions():
    from seqpar.planner import clusters
    from seqpar.planner import plan as perf_plan
    from seqpar.sweeps.tune import option_space

    space = [(n, o) for n in ("ulysses", "usp", "ring") for o in option_space(n, 16)]
    ranked = perf_plan.rank(clusters.load("burst-a800"), "llama3-8b", 65536, 16, space, nodes=2)
    groups = perf_plan.equivalents(ranked)
    assert sum(map(len, groups)) == len(ranked) > len(groups)
    for g in groups:  # identical up to the last bit of a sum taken in another order
        assert len({(p.algorithm, p.bytes_inter, p.peak_mem_bytes) for p in g}) == 1
        assert max(p.attention_ms for p in g) - min(p.attention_ms for p in g) < 1e-9
    firsts = [g[0].attention_ms for g in groups]
    assert firsts == sorted(firsts)  # still in rank order
    distinct = {(g[0].algorithm, round(g[0].attention_ms, 6), g[0].bytes_intra) for g in groups}
    assert len(distinct) == len(groups)


def test_plan_model_scope_table_has_step_time_and_policy(monkeypatch):
    out = _table(monkeypatch, "--cluster", "burst-a800", "--model", "llama2-7b", "--seq-len",
                 "131072", "--world", "16", "--scope", "model", "--top", "3")
    assert "step" in out and "TGS" in out and "dp_sp" in out  # the training policy of each row
    assert max(len(line) for line in out.splitlines()) <= 120


def test_plan_model_scope_ranks_states_and_heads_and_finds_burstengines_14b_fits():
    """BurstEngine's 14B at 256K tokens on 8 x A800 80 GB: configurations fit once states are
    sharded; replicated states (16 bytes a parameter, 223 GB) never fit."""
    from seqpar.planner import clusters
    from seqpar.planner import plan as perf_plan

    ranked = perf_plan.rank(clusters.load("burst-a800"), "14b", 262144, 8,
                            [("ring", {}), ("ulysses", {})], scope="model")
    fits = [p for p in ranked if p.fits]
    assert fits and all(p.policy.states == "dp_sp" for p in fits)
    assert any(not p.fits and p.policy.states == "dp_sp" for p in ranked)
    assert all(p.peak_mem_bytes <= 80e9 for p in fits)


# ------------------------------------------------------------------ issue 32: every configuration
PINNED = ("--cluster", "loongtrain-a100", "--model", "llama2-7b", "--seq-len", "131072",
          "--world", "32", "--nodes", "4", "--scope", "model", "--algorithm", "usp")


def test_plan_option_pins_an_algorithm_option_and_resolves_the_rest(monkeypatch):
    """LoongTrain's HP4/CP8 row at 128K on 32 A100s: `--option dhp=4 --option dcp=8` prints it;
    `dhp=4` alone resolves dcp=8 (every placement and inner ring of it)."""
    out = plan_json(*PINNED, "--option", "dhp=4", "--option", "dcp=8", "--checkpoint", "full")
    assert out["configs"] and all(
        (c["options"]["dhp"], c["options"]["dcp"], c["checkpoint"]) == (4, 8, "full")
        for c in out["configs"])
    alone = plan_json(*PINNED, "--option", "dhp=4", "--checkpoint", "full", "--top", "0")
    assert {(c["options"]["dhp"], c["options"]["dcp"]) for c in alone["configs"]} == {(4, 8)}
    assert {c["options"]["placement"] for c in alone["configs"]} == {"head-first",
                                                                      "context-first"}
    table = _table(monkeypatch, *PINNED, "--option", "dhp=4", "--option", "dcp=8",
                   "--checkpoint", "full")
    assert re.search(r"\n\s*1\s+1x32\s+usp\s+dhp=4", table)


@pytest.mark.parametrize(("pins", "words"), [
    (("dhp=5",), "dhp=5: must be a positive divisor of the world size (32)"),
    (("dhp=4", "dcp=16"), "dcp=16: dhp * dcp must equal the world size (32)"),
    (("team=2",), "names no algorithm option"),
    (("dhp",), "must be KEY=VALUE"),
])
def test_plan_impossible_pin_is_one_line(pins, words):
    from seqpar.errors import ConfigError

    args = [a for p in pins for a in ("--option", p)]
    result = CliRunner().invoke(app, ["plan", *PINNED, *args, "--json"])
    assert isinstance(result.exception, ConfigError), result.output
    assert words in str(result.exception) and "\n" not in str(result.exception)


def test_plan_top_0_lists_the_dominated_configurations_marked():
    """The issue's case: usp at 128K on 32 GPUs over 4 nodes, full checkpointing, states over DP x
    SP listed dhp = 32, 16 and 8 only; with --top 0 every dhp is there, the dominated ones marked
    with the configuration that beats them (timed under its best policy)."""
    out = plan_json(*PINNED, "--checkpoint", "full", "--states", "dp_sp", "--top", "0")
    configs = out["configs"]
    assert {c["options"]["dhp"] for c in configs} == {1, 2, 4, 8, 16, 32}
    marked = [c for c in configs if c["dominated_by"]]
    assert marked and len(marked) == out["dominated"]
    best = {json.dumps([c["options"], c["layout"]]): c for c in configs if not c["dominated_by"]}
    for c in marked:
        by = c["dominated_by"]
        assert json.dumps([by["options"], by["layout"]]) in best
    plain = plan_json(*PINNED, "--checkpoint", "full", "--states", "dp_sp")
    assert not any(c["dominated_by"] for c in plain["configs"])


def test_plan_cluster_scope_defaults_to_one_sequence_per_replica():
    out = plan_json("--cluster", "h100-sxm", "--model", "llama3.1-8b", "--seq-len", "65536",
                    "--world", "16", "--nodes", "2", "--scope", "cluster", "--top", "5")
    assert out["tokens_per_step"] is None
    assert {s["micro_batches"] for s in out["splits"]} == {1}
    for c in out["configs"]:
        p = c["predicted"]
        assert p["tgs"] == pytest.approx(c["dp"] * 65536 / (p["step_ms"] / 1e3 * 16), rel=1e-3)


def test_plan_help_names_every_states_choice_and_seq_attn():
    result = CliRunner().invoke(app, ["plan", "--help"], env={"COLUMNS": "200"})
    text = " ".join(result.output.split())
    assert "dp_sp | sp | node | replicated | zero1" in text and "seq-attn:F" in text


def test_plan_says_which_limit_nothing_fits_and_the_least_memory_in_one_unit():
    """BurstEngine's 14B at 1M on 32 A800s under seq:0.5 (the attention kept whole): nothing fits."""
    result = CliRunner().invoke(app, [
        "plan", "--cluster", "burst-a800", "--model", "14b", "--seq-len", "1048576", "--world",
        "32", "--nodes", "4", "--scope", "model", "--algorithm", "burst", "--layout", "stripe",
        "--states", "dp_sp", "--checkpoint", "seq:0.5", "--fused-head", "--no-tiled",
        "--offload", "none"], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "nothing fits in the 80 GB (1e9 bytes) of device memory a GPU on burst-a800" in text
    assert re.search(r"the least memory found is 1\d\d\.\d GB: dp=1 sp=32 burst dp_sp seq:0.5",
                     text)


def test_vs_1_says_host_bound_only_where_the_host_sets_the_pace():
    from types import SimpleNamespace

    from seqpar.planner.why import why_slower

    def step(ms: float, tgs: float, **parts: float) -> SimpleNamespace:
        return SimpleNamespace(fits=True, step_ms=ms, tgs=tgs, host_bound=True,
                               parts={"attention": 0.0, "exposed_comm": 0.0, "host": 0.0, **parts})

    links = step(100.0, 10.0, attention=24.0, exposed_comm=69.0, host=7.0)  # ho 7%, cm 69%
    host = step(100.0, 10.0, attention=30.0, exposed_comm=20.0, host=50.0)
    assert why_slower(links, links) == "best" and why_slower(host, host) == "best; host-bound"
    # one sequence a DP replica: half the tokens in half the time is a tie, not a faster step
    half = step(50.0, 10.0, attention=12.0, exposed_comm=34.5, host=3.5)
    assert why_slower(half, links).startswith("ties #1")
    slower = step(50.0, 8.0, attention=12.0, exposed_comm=47.0, host=3.5)  # 0.4 of the tokens
    assert why_slower(slower, links) == "+25%: exposed comm +0.049s"  # 47 / 0.4 - 69 ms
