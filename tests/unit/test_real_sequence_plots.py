"""The report's plots for documents, windows and accuracy, from runs as MLflow returns them."""

from __future__ import annotations

import pytest

from seqpar.platform.tracking import RunRecord
from seqpar.sweeps.report import TrialView, figures
from seqpar.sweeps.report.plots import accuracy_series, visible_fraction, window_savings


def run(algorithm: str, world: int, **over) -> TrialView:
    params = {"plan.algorithm": algorithm, "plan.world": str(world), "plan.layout": "zigzag",
              "workload.seq_len": "4096", "model.heads": "8", "model.kv_heads": "8",
              "workload.dtype": "float32", "workload.causal": "True", "workload.window": "None",
              "workload.documents": "None"}
    metrics = {"tokens_per_s": 100.0, "step_ms": 10.0, "attn_flops": 1e9, "bytes_total": 1e6,
               "load_imbalance": 1.0}
    for k, v in over.items():
        (params if "." in k else metrics)[k] = v
    return TrialView.of(RunRecord(f"id-{algorithm}-{world}-{len(over)}", algorithm, "FINISHED", 0,
                              params=params, metrics=metrics))


def err(algorithm: str, world: int, dtype: str, e: float) -> TrialView:
    return run(algorithm, world, **{"workload.dtype": dtype, "err_out": e, "err_dq": e,
                                    "err_dk": 2 * e, "err_dv": e, "err_max": 2 * e})


def test_accuracy_series_start_at_the_one_process_kernel_of_their_dtype():
    runs = [err("local", 1, "float32", 1e-7), err("ring", 2, "float32", 2e-7),
            err("ring", 4, "float32", 3e-7), err("local", 1, "bfloat16", 1e-3),
            err("ring", 4, "bfloat16", 4e-3)]
    series = accuracy_series(runs)
    assert [(p, r.metrics["err_out"]) for p, r in series[("float32", "ring")]] == [
        (1, 1e-7), (2, 2e-7), (4, 3e-7)]
    assert [p for p, _ in series[("bfloat16", "ring")]] == [1, 4]
    figs = figures(runs)
    assert set(figs) == {"accuracy_vs_world"}  # one pass per trial: no timing plots
    assert len(figs["accuracy_vs_world"].axes) == 8  # 2 dtypes x (out, dq, dk, dv)


def test_window_savings_are_ratios_to_full_causal_of_the_same_configuration():
    runs = [run("ring", 4), run("ring", 4, **{"workload.window": "512"}, step_ms=4.0,
                                attn_flops=2.5e8, bytes_total=1e6),
            run("ring", 4, **{"workload.window": "128", "plan.layout": "stripe"}),  # no full run
            run("local", 1), run("local", 1, **{"workload.window": "512"}, step_ms=2.0)]
    savings = window_savings(runs)
    assert set(savings) == {"ring P=4 zigzag", "local P=1 zigzag"}
    w, ratios, _ = savings["ring P=4 zigzag"][0]
    assert w == 512 and ratios == pytest.approx({"step_ms": 0.4, "attn_flops": 0.25,
                                                 "bytes_total": 1.0})
    assert "window_savings" in figures(runs)
    # W = N/8 over a causal N: about 2W/N of the causal pairs remain
    assert visible_fraction(4096, 512) == pytest.approx(2 * 512 / 4096 * (1 - 512 / 8192), rel=2e-3)
    assert visible_fraction(64, 64) == 1.0


def test_varlen_plot_shows_imbalance_per_layout_and_the_documents():
    docs = {"workload.documents.count": "12", "workload.documents.spread": "1.25",
            "workload.documents.seed": "0"}
    runs = [run("local", 1, **docs), run("ring", 4, **docs, load_imbalance=1.3),
            run("ring", 4, **{**docs, "plan.layout": "stripe"}, load_imbalance=1.02)]
    assert runs[1].mask == "causal docs=12"
    fig = figures(runs)["varlen_balance"]
    assert "longest" in fig._suptitle.get_text() and "12 drawn" in fig._suptitle.get_text()
    imbalance = fig.axes[1]
    assert [round(p.get_width(), 2) for p in imbalance.patches] == [1.0, 1.3, 1.02]
