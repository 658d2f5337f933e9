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
    from seqpar.experiments.registry import STUDIES

    local = clusters.load("local")
    trials = []
    for p in STUDIES["placement"].points("cpu"):
        if p.spec is None:
            continue
        params = {k: str(v) for k, v in p.spec.flat().items()}  # as MLflow stores them
        pred = perf_plan.predict_spec(p.spec, perf_plan.emulated(p.spec, local)).attention_ms
        trials.append((params, {"step_ms": pred * 1.1}))
    checks = perf_plan.validate(trials, local)
    assert len(checks) == len(trials) >= 4
    s = perf_plan.summary(checks)
    assert abs(s["median_abs_error"] - (1 - 1 / 1.1)) < 1e-6
    assert s["max_regret"] == 0 and len(s["regret"]) == 1
