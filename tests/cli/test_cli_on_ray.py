"""`seqpar sweep` end to end in this process on the session's Ray (`ray_runner`) and a temporary
MLflow store: retries after a transient fault, no retry of a deterministic one, resume after a
FAILED trial, and the exit codes (0 ok, 1 failed trials, 130 Ctrl-C)."""

from __future__ import annotations

import contextlib
import re
import sys

import pytest

from seqpar.cli import app as cli_app
from seqpar.cli import options
from seqpar.platform.tracking import Tracker

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("sweeps_share_a_gang")]  # one gang of 2

TWO_TRIALS = """\
name: cli-faults
base:
  model: {heads: 2, kv_heads: 2, head_dim: 8}
  plan: {world: 2}
  workload: {seq_len: 32, warmup: 0, iters: 1}
  env: {device: cpu}
grid: {plan.algorithm: [ring, ulysses]}
"""


class Cli:
    def __init__(self, monkeypatch, capsys, uri: str):
        self.monkeypatch, self.capsys, self.uri = monkeypatch, capsys, uri
        self.tracker = Tracker(uri)

    def __call__(self, *args: str) -> tuple[int, str, str]:
        self.monkeypatch.setattr(sys, "argv", ["seqpar", "--tracking-uri", self.uri, *args])
        with pytest.raises(SystemExit) as info:
            cli_app.main()
        out = self.capsys.readouterr()
        return info.value.code, out.out, out.err

    def runs(self, sweep_id: str) -> dict[str, object]:
        """The sweep's trial runs by algorithm (one each, or the test fails)."""
        runs = self.tracker.trials(sweep_id)
        algos = [r.params["plan.algorithm"] for r in runs]
        assert len(algos) == len(set(algos)), f"duplicate runs: {algos}"
        return {r.params["plan.algorithm"]: r for r in runs}


@pytest.fixture
def cli(ray_runner, monkeypatch, capsys, tmp_path, fresh_store) -> Cli:
    # the commands run on the shared Ray instead of starting (and stopping) their own
    monkeypatch.setattr(options, "trial_runner",
                        lambda settings=None, device=None, **_: contextlib.nullcontext(ray_runner))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "two.yaml").write_text(TWO_TRIALS)
    return Cli(monkeypatch, capsys, fresh_store)


def sweep_id_of(out: str) -> str:
    match = re.search(r"sweep id ([0-9a-f]{32})", out)
    assert match, out
    return match.group(1)


@pytest.mark.slow
def test_retries_rerun_a_rank_that_died_and_the_sweep_succeeds(cli, arm_fault):
    arm_fault("die", rank=1)
    code, out, err = cli("sweep", "two.yaml", "--retries", "1")
    assert code == 0, out + err
    runs = cli.runs(sweep_id_of(out))
    assert {a: (r.status, r.tags["seqpar.attempts"]) for a, r in runs.items()} == {
        "ring": ("FINISHED", "2"), "ulysses": ("FINISHED", "1")}
    assert "seqpar.failure" not in runs["ring"].tags  # the logged (last) attempt succeeded


@pytest.mark.slow  # a dead rank fails its trial: tests/platform/test_ray_faults.py
def test_without_retries_a_dead_rank_fails_the_sweep_with_exit_1(cli, arm_fault):
    arm_fault("die", rank=1)
    code, out, err = cli("sweep", "two.yaml")
    assert code == 1, out + err
    runs = cli.runs(sweep_id_of(out))
    assert runs["ring"].status == "FAILED" and runs["ring"].tags["seqpar.failure"] == "rank_died"
    assert runs["ulysses"].status == "FINISHED"
    assert "1 failed" in out and "--resume" in out


def test_a_rank_that_raises_is_not_retried_then_resume_reruns_only_it(cli, arm_fault):
    arm_fault("raise", rank=1)  # once: a retry on a fresh gang would pass, so it must not be made
    code, out, err = cli("sweep", "two.yaml", "--retries", "2")
    assert code == 1, out + err
    sweep_id = sweep_id_of(out)
    failed = cli.runs(sweep_id)["ring"]
    assert failed.status == "FAILED" and failed.tags["seqpar.attempts"] == "1"
    assert failed.tags["seqpar.failure"] == "rank_raised"
    assert failed.tags["seqpar.cause"].startswith("rank 1 raised ValueError: injected")

    code, out, err = cli("sweep", "two.yaml", "--resume", sweep_id)
    assert code == 0, out + err
    assert "1 run, 1 already done, 0 failed" in out
    runs = cli.runs(sweep_id)  # one run per trial: the FAILED one was replaced
    assert {a: r.status for a, r in runs.items()} == {"ring": "FINISHED", "ulysses": "FINISHED"}
    assert cli.tracker.sweep(sweep_id).status == "FINISHED"


def test_ctrl_c_exits_130_and_says_how_to_resume(cli, monkeypatch):
    from seqpar.sweeps import runner

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run_one", interrupted)
    code, out, err = cli("sweep", "two.yaml")
    assert code == 130, out + err
    assert "interrupted" in out and "--resume <sweep id>" in out
    sweep = cli.tracker.latest_sweep()
    assert sweep.status == "KILLED" and cli.tracker.trials(sweep.run_id) == []


def test_tune_without_dry_run_profiles_ranks_and_logs_the_configurations(cli):
    code, out, err = cli("tune", "-P", "2", "--seq-len", "64", "--iters", "1", "--prune", "2")
    assert code == 0, out + err
    assert "tuning space" in out and "tuning ranking: arg max tokens/s" in out
    sweep = cli.tracker.latest_sweep()
    assert cli.tracker.experiment_name(sweep) == "tune" and sweep.status == "FINISHED"
    runs = cli.tracker.trials(sweep.run_id)
    assert len(runs) == 2 and {r.status for r in runs} == {"FINISHED"}
    ranking = out[out.index("tuning ranking"):]
    best = max(runs, key=lambda r: r.metrics["tokens_per_s"])
    first_row = next(ln for ln in ranking.splitlines() if ln.strip().startswith("│ 1 "))
    assert best.params["plan.algorithm"] in first_row


@pytest.mark.slow  # the ratios from logged runs: tests/platform/test_unstable_trials.py
def test_compare_baseline_prints_each_trials_time_ratio_with_its_interval(cli):
    import json

    from seqpar.workers.stability import NO_DIFFERENCE

    code, out, err = cli("sweep", "two.yaml", "--set", "workload.iters=4")
    assert code == 0, out + err
    assert re.search(r"step [\d.]+ ms \([\d.]+-[\d.]+\)", out + err), err  # the intervals
    code, out, err = cli("compare", "--baseline", "ring", "--json")
    assert code == 0, out + err
    rows = {r["algorithm"]: r for r in json.loads(out)}
    assert rows["ring"]["verdict"] == "baseline" and rows["ring"]["time ratio"] == "1.00"
    uly, ring = rows["ulysses"], rows["ring"]
    lo, hi = (float(x) for x in uly["ratio 95% CI"].split("-"))
    assert lo <= float(uly["time ratio"]) <= hi
    (a, b), (c, d) = ((float(x) for x in r["95% CI"].split("-")) for r in (uly, ring))
    assert (uly["verdict"] == NO_DIFFERENCE) == (a <= d and c <= b)  # the intervals overlap
    code, out, err = cli("compare", "--baseline", "burst")
    assert code == 2 and "--baseline" in out + err
    code, out, err = cli("sweep", "two.yaml", "--rerun-unstable", "-1")
    assert code == 2 and "--rerun-unstable" in out + err
