"""A long sweep reads in one screen and draws a report the size of its groups: the digest (winners
per group, the near ones, the rest counted, flags by kind, the commands that list more), --top and
--where, the CSV of every trial, figures that aggregate past a bar a trial, the winners' map where
two axes vary, and the dozen trials whose per-rank records the report keeps. Synthetic trials: no
Ray, no store."""

from __future__ import annotations

import csv
import io
import random

import pytest

from seqpar.errors import ConfigError
from seqpar.platform.run_entities import batches
from seqpar.platform.tracking import RunRecord
from seqpar.sweeps import style
from seqpar.sweeps.report import digest as dg
from seqpar.sweeps.report.page import render
from seqpar.sweeps.report.plots import MAX_RANK_PANELS, detail_candidates, figures
from seqpar.sweeps.report.table import table
from seqpar.sweeps.report.view import SweepView, TrialView

ALGORITHMS = ("ring", "ulysses", "allgather", "usp")


def trial(algorithm: str, seq_len: int, tps: float, world: int = 2, unstable: str | None = None,
          status: str = "FINISHED") -> TrialView:
    step = seq_len / tps * 1e3
    tags = {"seqpar.device": "cpu", "seqpar.cpu_count": "8"}
    if unstable:
        tags["seqpar.unstable"] = unstable
    if status != "FINISHED":
        tags["seqpar.cause"] = "timeout: trial exceeded 60 s"
    metrics = {} if status != "FINISHED" else {
        "tokens_per_s": tps, "step_ms": step, "step_ms_ci_low": step * 0.98,
        "step_ms_ci_high": step * 1.02, "peak_mem_bytes": 2.0**20, "bytes_total": seq_len * 1e3,
        "bytes_intra": seq_len * 1e3, "bytes_analytic_per_rank": seq_len * 500.0 * world / 2}
    return TrialView.of(RunRecord(
        f"{algorithm}-{world}-{seq_len}", f"{algorithm} P={world} N={seq_len}", status, 0,
        params={"plan.algorithm": algorithm, "plan.world": str(world), "plan.layout": "zigzag",
                "workload.seq_len": str(seq_len), "model.heads": "2", "model.kv_heads": "2"},
        metrics=metrics, tags=tags))


@pytest.fixture
def long_sweep(seed) -> list[TrialView]:
    """4 algorithms x 60 lengths: ring wins from 1024 on, ulysses below, allgather 2% behind the
    winner everywhere, usp 30% behind; a few unstable, one failed."""
    rng = random.Random(seed)
    out = []
    for i in range(60):
        n = 64 + 32 * i
        best = 1e5 * (1 + rng.random())
        winner = "ring" if n >= 1024 else "ulysses"
        for algorithm in ALGORITHMS:
            tps = {winner: best, "allgather": best * 0.98, "usp": best * 0.7}.get(algorithm,
                                                                                  best * 0.8)
            shaky = "interval ±31% (of the median, > 10%, 3 iterations)" if i % 10 == 3 else None
            failed = algorithm == "usp" and i == 7
            out.append(trial(algorithm, n, tps, unstable=shaky,
                             status="FAILED" if failed else "FINISHED"))
    return out


def test_a_long_sweep_is_digested_into_one_screen_with_winners_first(long_sweep):
    cmp = table("sweep s", long_sweep, "tokens_per_s")
    shown = dg.screen(cmp)
    assert len(shown.rows) == dg.MAX_GROUPS  # a row a group, evenly spaced over the 60
    assert "240 trials" in shown.title and "the winner of each group by N" in shown.title
    algo, n = shown.columns.index("algorithm"), shown.columns.index("N")
    for row in shown.rows:  # the winner of its length, the near one named beside it
        assert row[algo] == ("ring" if int(row[n]) >= 1024 else "ulysses"), row
        assert row[-1].startswith("allgather -2.0%"), row
    wins = [n for n in shown.notes if n.startswith("wins ")]
    assert wins == ["wins ulysses: 30 of 60 groups: N=64..N=992",
                    "wins ring: 30 of 60 groups: N=1024..N=1952"]
    assert "near the winners (within 5%): 60 trial(s); the other 120 trial(s)" in " ".join(
        shown.notes)
    flags = next(n for n in shown.notes if n.startswith("flags:"))
    assert "U 24 unstable (interval: 24" in flags and "F 1 failed (FAILED: timeout: 1)" in flags
    assert any("--all" in n for n in shown.notes) and any("--top N" in n and "--where KEY=VALUE"
                                                          in n for n in shown.notes)
    lines = len(shown.rows) + len(shown.notes) + 4  # title, header, rule, legend at most
    assert lines <= 40, lines


def test_a_small_sweep_is_shown_as_it_is(long_sweep):
    cmp = table("sweep s", long_sweep[:8], "tokens_per_s")
    assert dg.screen(cmp) is cmp


def test_top_and_where_list_the_trials_themselves(long_sweep):
    cmp = table("sweep s", long_sweep, "tokens_per_s")
    best = dg.top(cmp, 3)
    tps = [t.metrics["tokens_per_s"] for t in best.trials]
    assert len(best.rows) == 3 and tps == sorted(tps, reverse=True) and best.best == 0
    assert tps[0] == max(t.metrics.get("tokens_per_s", 0) for t in long_sweep)
    ring = dg.where(cmp, ["algorithm=ring", "N=1024"])
    assert [(t.algorithm, t.seq_len) for t in ring.trials] == [("ring", 1024)]
    assert {t.algorithm for t in dg.where(cmp, ["world=2", "flags=U"]).trials} == set(ALGORITHMS)
    assert len(dg.where(cmp, ["flags=U"]).rows) == 24
    with pytest.raises(ConfigError, match="--where.*KEY one of algorithm"):
        dg.where(cmp, ["colour=blue"])
    with pytest.raises(ConfigError, match="--top"):
        dg.top(cmp, 0)


def test_the_csv_holds_every_trial_and_column(long_sweep):
    cmp = table("sweep s", long_sweep, "tokens_per_s")
    rows = list(csv.reader(io.StringIO(dg.csv_text(cmp))))
    assert rows[0] == cmp.columns and len(rows) == 1 + len(long_sweep)


def test_a_long_sweeps_page_is_the_size_of_its_groups(long_sweep):
    sweep = SweepView("abc", "s", "exp", 0, {}, "sqlite:///x")
    page = {}
    for lengths in (20, 60):
        runs = [t for t in long_sweep if t.seq_len < 64 + 32 * lengths]
        html = render(sweep, runs, cmp=table("s", runs, "tokens_per_s"), pngs={},
                      csv_name="report.csv")
        assert 'href="report.csv" download' in html and "the winner of each group" in html
        page[lengths] = len(html)
    per_group = (page[60] - page[20]) / 40
    assert per_group < 700, page  # a row a group, not four


def test_figures_aggregate_past_a_bar_a_trial(long_sweep):
    ok = [t for t in long_sweep if t.finished]
    figs = figures(ok)
    try:
        assert {"bytes_vs_seq_len", "bytes_ratio_vs_seq_len"} <= set(figs)
        assert not {"bytes_by_link", "bytes_measured_vs_analytic"} & set(figs)
        assert "winners_map" not in figs  # one axis besides the algorithm: the lines say it
        lines = figs["throughput_vs_seq_len"].axes[0].get_lines()
        assert len(lines) == len(ALGORITHMS)  # one line per algorithm across 60 lengths
        ticks = figs["throughput_vs_seq_len"].axes[0].get_xticks()
        assert len(ticks) <= style.MAX_TICKS
    finally:
        style.close(figs.values())


def test_a_winners_map_where_two_axes_vary():
    runs = [trial(a, n, tps=1e5 * (2 if a == ("ring" if w == 4 else "ulysses") else 1), world=w)
            for a in ("ring", "ulysses") for n in (256, 512, 1024, 2048) for w in (2, 4)
            for _ in range(2)]
    runs = list({t.run_id: t for t in runs}.values()) * 2  # > MAX_BARS trials
    figs = figures(runs)
    try:
        heat = figs["winners_map"]
        labels = [t.get_text() for t in heat.axes[0].get_legend().get_texts()]
        assert labels == ["ring", "ulysses"]
        assert heat.axes[0].get_ylabel() == "P" and heat.axes[0].get_xlabel() == "N"
    finally:
        style.close(figs.values())


def test_the_report_keeps_a_dozen_per_rank_records_whatever_the_size(long_sweep):
    chosen = detail_candidates(long_sweep)
    ends = {(t.algorithm, t.seq_len) for t in chosen}  # each configuration's smallest and largest
    assert ends == {(a, n) for a in ALGORITHMS for n in (64, 64 + 32 * 59)}
    assert len(detail_candidates(long_sweep[:12])) == 12  # a short sweep: every trial a panel

    from types import SimpleNamespace

    from seqpar.sweeps.outcome import DetailKeeper

    keeper = DetailKeeper()  # as the runner offers each trial when it is logged
    for t in random.Random(0).sample(long_sweep, len(long_sweep)):
        keeper.offer(t, SimpleNamespace(to_dict=lambda t=t: {"run": t.run_id}))
        assert len(keeper.details) <= 2 * len(ALGORITHMS) + MAX_RANK_PANELS
    assert {t.run_id for t in chosen} <= set(keeper.details)


def test_params_and_metrics_go_in_as_few_batches_as_mlflow_takes():
    assert list(batches([], [])) == []
    one = list(batches(list(range(60)), list(range(300))))
    assert one == [(list(range(60)), list(range(300)))]
    many = list(batches(list(range(150)), list(range(2000))))
    assert all(len(p) <= 100 and len(p) + len(m) <= 1000 for p, m in many)
    assert sum(len(p) for p, _ in many) == 150 and sum(len(m) for _, m in many) == 2000
    assert len(many) == 3


def test_cluster_status_reads_the_sweeps_pace_and_time_left():
    from types import SimpleNamespace

    from seqpar.cli.cluster import _pace
    from seqpar.platform import metrics
    from seqpar.platform.dashboard import sweep_progress

    actors = [SimpleNamespace(name="seqpar:sweep-1a2b3c4d:rank-0", actor_id="a0",
                              repr_name="RankWorker(sweep=demo 1a2b3c4d, rank=0/1)")]
    samples = [metrics.Sample("ray_seqpar_sweep_trials", {"sweep": "1a2b3c4d", "status": s}, v)
               for s, v in (("done", 412), ("failed", 0), ("pending", 588))]
    (before,) = sweep_progress(actors, {}, samples)
    assert _pace(before) == "-"
    samples += [metrics.Sample("ray_seqpar_sweep_trials_per_min", {"sweep": "1a2b3c4d"}, 95.3),
                metrics.Sample("ray_seqpar_sweep_left_s", {"sweep": "1a2b3c4d"}, 370.0)]
    (running,) = sweep_progress(actors, {}, samples)
    assert running["trials"]["done"] == 412 and _pace(running) == "95.3/min, 0:06:10 left"


def test_a_long_sweeps_trial_line_counts_done_of_total_with_pace_and_time_left():
    from rich.console import Console

    from seqpar.sweeps.progress import LONG_SWEEP, SweepProgress

    short = SweepProgress(Console(file=io.StringIO()), [None] * 3, "g", enabled=False)
    short.end_trial(1.0)
    assert short.count() == ""
    live = SweepProgress(Console(file=io.StringIO()), [None] * LONG_SWEEP, "g", enabled=False,
                         done=10)
    for _ in range(3):
        live.end_trial(2.0)
    left = 2 * (LONG_SWEEP - 3)  # the mean trial's 2 s for every pending one
    assert live.count().startswith(f"[13/{LONG_SWEEP + 10} done, ")
    assert live.count().endswith(f", 0:{left // 60:02d}:{left % 60:02d} left]"), live.count()
    assert live.bar.tasks[0].fields["left"] == f"trials 13/{LONG_SWEEP + 10}"


def test_a_resume_with_every_trial_done_is_answered_from_one_search(fresh_store):
    from seqpar.platform.tracking import Tracker
    from seqpar.sweeps import spec
    from seqpar.sweeps.record import nothing_left

    plan = spec.parse({"name": "done", "base": {"model": {"heads": 2, "kv_heads": 2,
                                                          "head_dim": 8}, "plan": {"world": 2},
                                                "env": {"device": "cpu"}},
                       "grid": {"plan.algorithm": ["ring", "ulysses"],
                                "workload.seq_len": [64, 128]}})
    tracker = Tracker(fresh_store)
    sweep = tracker.start_sweep(plan.experiment, plan.name, {}, {})
    for p in plan.trials[:-1]:
        tracker.log_trial(sweep, name=p.label, spec_hash=p.spec.hash, params=p.spec.flat(),
                          metrics={"tokens_per_s": 1.0}, tags={}, status="FINISHED", cause=None,
                          detail={})
    tracker.end_sweep(sweep)
    assert nothing_left(plan, tracker, sweep) is None  # one trial left to run
    last = plan.trials[-1]
    tracker.log_trial(sweep, name=last.label, spec_hash=last.spec.hash, params=last.spec.flat(),
                      metrics={"tokens_per_s": 1.0}, tags={}, status="FINISHED", cause=None,
                      detail={})
    searches = []
    search = tracker.client.search_runs
    tracker.client.search_runs = lambda *a, **k: searches.append(1) or search(*a, **k)
    views = nothing_left(plan, tracker, sweep)
    assert views is not None and len(views) == 4 and searches == [1]
    other = spec.parse({"name": "elsewhere", "base": {"env": {"device": "cpu"}},
                        "grid": {"plan.algorithm": ["ring"]}})
    with pytest.raises(ConfigError, match="resume"):
        nothing_left(other, tracker, sweep)
