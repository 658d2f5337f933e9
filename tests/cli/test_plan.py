"""`seqpar plan`: the JSON shape of issue 11, fitting configurations ranked, unfit ones listed."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from seqpar.cli.app import app


def plan_json(*args: str) -> dict:
    result = CliRunner().invoke(app, ["plan", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


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


def test_plan_model_scope_has_step_time_and_mfu():
    out = plan_json("--cluster", "burst-a800", "--model", "llama2-7b", "--seq-len", "131072",
                    "--world", "16", "--scope", "model")
    best = out["configs"][0]
    assert best["predicted"]["step_ms"] > 32 * best["predicted"]["attention_ms"] * 0.5
    assert 0 < best["predicted"]["mfu"] < 1
    assert "checkpoint" in best["options"]


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
    from seqpar.experiments import clusters
    from seqpar.experiments.perf import plan as perf_plan
    from seqpar.experiments.perf import predict_spec
    from seqpar.experiments.registry import STUDIES

    local = clusters.load("local")
    trials = []
    for p in STUDIES["placement"].points("cpu"):
        if p.spec is None:
            continue
        params = {k: str(v) for k, v in p.spec.flat().items()}  # as MLflow stores them
        pred = predict_spec(p.spec, perf_plan.emulated(p.spec, local)).attention_ms
        trials.append((params, {"step_ms": pred * 1.1}))
    checks = perf_plan.validate(trials, local)
    assert len(checks) == len(trials) >= 4
    s = perf_plan.summary(checks)
    assert abs(s["median_abs_error"] - (1 - 1 / 1.1)) < 1e-6
    assert s["max_regret"] == 0 and len(s["regret"]) == 1


def _table(monkeypatch, *args: str) -> str:
    from seqpar.cli import display

    monkeypatch.setattr(display.console, "width", 120)
    result = CliRunner().invoke(app, ["plan", *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_plan_table_merges_identical_configurations_and_fits_120_columns(monkeypatch):
    args = ("--cluster", "loongtrain-a100", "--model", "llama2-7b", "--seq-len", "262144",
            "--world", "32")
    out = _table(monkeypatch, *args, "--top", "8")
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 120
    rows = [line for line in lines if line[:4].strip().isdigit() and "configurations" not in line]
    assert len(rows) == 8
    assert sum(" ulysses " in r for r in rows) == 1 and " any " in rows[0]  # its layout: no change
    assert "step" not in out and "MFU" not in out  # empty in the attention scope
    assert any("ring=1|2|4" in r for r in rows)  # usp's inner rings that change nothing: one row
    configs = plan_json(*args)["configs"]
    assert f"{len(configs)} configurations in " in " ".join(lines)
    assert sum(c["algorithm"] == "ulysses" for c in configs) == 3  # --json keeps every one


def test_plan_rows_are_configurations_with_identical_predictions():
    from seqpar.experiments import clusters
    from seqpar.experiments.perf import plan as perf_plan
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


def test_plan_model_scope_table_has_step_time_and_mfu(monkeypatch):
    out = _table(monkeypatch, "--cluster", "burst-a800", "--model", "llama2-7b", "--seq-len",
                 "131072", "--world", "16", "--scope", "model", "--top", "3")
    assert "step" in out and "MFU" in out and "fsdp" in out  # the training policy of each row
    assert max(len(line) for line in out.splitlines()) <= 120


def test_plan_model_scope_ranks_states_and_heads_and_finds_burstengines_14b_fits():
    """BurstEngine's 14B at 256K tokens on 8 x A800 80 GB: configurations fit once states are
    sharded and the head fused; replicated states (16 bytes a parameter, 223 GB) never fit."""
    from seqpar.experiments import clusters
    from seqpar.experiments.perf import plan as perf_plan

    ranked = perf_plan.rank(clusters.load("burst-a800"), "14b", 262144, 8,
                            [("ring", {}), ("ulysses", {})], scope="model")
    fits = [p for p in ranked if p.fits]
    assert fits and all(p.options["checkpoint"].startswith("fsdp") for p in fits)
    assert any(not p.fits and p.options["checkpoint"].startswith("fsdp") for p in ranked)
    assert all(p.peak_mem_bytes <= 80e9 for p in fits)
