"""`seqpar check`, the README's first command, run as a user runs it (in this process, tiny shapes):
its exit codes, --json, --bench, and the real forms it gives usp, double_ring and wallfacer."""

from __future__ import annotations

import contextlib
import json
import sys

import pytest

from seqpar.cli import app as cli_app
from seqpar.workers import checking

pytestmark = pytest.mark.multirank

TINY = ["--seq-len", "16", "--batch", "1", "--heads", "4", "--kv-heads", "2", "--head-dim", "4",
        "--layouts", "zigzag", "--seed", "7"]


@pytest.fixture
def session_gang(gang, monkeypatch):
    """`seqpar check` runs on the session's gang instead of starting (and stopping) one of its
    own: the same ranks, without their start-up (the gang's sizes hold every P used here)."""
    from seqpar.platform import localgang

    monkeypatch.setattr(localgang, "LocalGang", lambda *a, **k: contextlib.nullcontext(gang))


def seqpar(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["seqpar", *args])
    with pytest.raises(SystemExit) as info:
        cli_app.main()
    out = capsys.readouterr()
    return info.value.code, out.out, out.err


def test_check_passes_with_exit_0_and_prints_only_json_on_stdout(session_gang, monkeypatch, capsys):
    code, out, err = seqpar(monkeypatch, capsys, "check", "-P", "4", "--algorithms",
                            "local,ring,usp,double_ring,wallfacer", "--json", *TINY)
    assert code == 0, out + err
    rows = json.loads(out)  # progress goes to stderr: stdout is the JSON alone
    assert "starting 4 local ranks" in err
    names = {r["algorithm"] for r in rows}
    # defaults reduce these three to a plain ring: check holds them in their real forms
    assert names == {"local", "ring", "usp dhp=2", "double_ring inner_ring=2", "wallfacer team_size=2"}
    assert len(rows) == 5 * 2 * 2  # causal and full, MHA and GQA
    for r in rows:
        assert r["status"] == "ok" and float(r["max rel err"]) < 1e-10, r
        assert r["fwd bytes"].endswith("✓") and r["bwd bytes"].endswith("✓"), r
        assert r["P"] == (1 if r["algorithm"] == "local" else 4)


def test_check_ends_with_its_count_and_times_no_warm_up(session_gang, monkeypatch, capsys):
    """The table's last line counts the exact cases; each algorithm's first call on its mesh (the
    groups' and kernels' set-up) is made once untimed, so no row's ms carries it."""
    from seqpar.workers.measure import check as check_worker

    run_case, evaluate = check_worker.run_case, check_worker.evaluate
    calls: list[tuple] = []   # the algorithm and mesh of every call, in order
    made: dict[int, int] = {}  # id of a call's results -> its position in `calls`
    timed: list[int] = []      # the positions of the calls whose results were evaluated

    def counted(gang, case, *args):
        results = run_case(gang, case, *args)
        calls.append((case.algorithm, check_worker.mesh_key(case)))
        made[id(results)] = len(calls) - 1
        return results

    def evaluated(case, results):
        timed.append(made[id(results)])
        return evaluate(case, results)

    monkeypatch.setattr(check_worker, "run_case", counted)
    monkeypatch.setattr(check_worker, "evaluate", evaluated)
    code, out, err = seqpar(monkeypatch, capsys, "check", "-P", "2", "--algorithms",
                            "local,ring,ulysses", *TINY)
    assert code == 0, out + err
    cases = 3 * 2 * 2  # causal and full, MHA and GQA
    assert out.strip().splitlines()[-1].startswith(
        f"{cases} of {cases} cases exact (output and gradients against float64"), out
    assert "ms: one forward and backward after an untimed warm-up" in out
    assert len(timed) == cases and len(calls) == cases + 3  # a warm-up an algorithm
    for i in timed:  # every timed call: its algorithm already ran on its mesh
        assert calls[i] in calls[:i], (i, calls)


@pytest.mark.parametrize("world", [4, 8])
@pytest.mark.parametrize("name", ["usp", "double_ring", "wallfacer"])
def test_check_runs_each_two_level_algorithm_in_a_real_two_level_form(name, world):
    """Where the ranks can split two ways, check's case of usp, double_ring and wallfacer lays
    them on a grid of two dims or more (not the defaults' plain ring), and the form is valid."""
    from seqpar import algorithms

    cases, skipped = checking.plan_cases([name], ["zigzag"], world, 64, 1, 4, 2, 4, "float64", 0)
    assert cases and not skipped
    for case in cases:
        cls = algorithms.get(name)
        grid = cls.grid(world, cls.parse(dict(case.options)))
        assert sum(size > 1 for _, size in grid.dims) >= 2, (case.options, grid)


def test_check_runs_the_defaults_where_no_two_level_form_fits():
    cases, skipped = checking.plan_cases(["usp", "wallfacer"], ["zigzag"], 2, 16, 1, 4, 2, 4,
                                          "float64", 0)
    assert not skipped and {c.options for c in cases} == {()}  # P=2: the defaults, not skipped


def test_a_wrong_result_exits_1_and_names_the_failure(session_gang, monkeypatch, capsys):
    from seqpar.workers.measure import check as check_worker

    evaluate = check_worker.evaluate

    def corrupted(case, results):  # one element of rank 1's dq is off: the reference must see it
        results[1].shards["dq"].view(-1)[0] += 1.0
        return evaluate(case, results)

    monkeypatch.setattr(check_worker, "evaluate", corrupted)
    code, out, err = seqpar(monkeypatch, capsys, "check", "-P", "2", "--algorithms", "ring",
                            "--json", *TINY)
    assert code == 1, out + err
    rows = json.loads(out)
    assert rows and all(r["status"].startswith("FAIL: dq error") for r in rows), rows
    assert f"{len(rows)} case(s) failed" in err


@pytest.mark.parametrize(("args", "needle"), [
    (["-P", "0"], "world=0"), (["--dtype", "int4"], "dtype='int4'"),
    (["--layouts", "spiral"], "layouts='spiral'"), (["--seq-len", "-1"], "seq_len=-1"),
    (["-P", "x"], "Invalid value for '--world'"), (["--device", "tpu"], "device='tpu'"),
])
def test_bad_input_exits_2_on_one_line(monkeypatch, capsys, args, needle):
    code, out, err = seqpar(monkeypatch, capsys, "check", *args)
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith("error: ") and needle in line


def test_bench_times_every_algorithm_against_local(session_gang, monkeypatch, capsys):
    import dataclasses

    median_ms = checking.median_ms

    def tiny(gang, case, *args):  # the benchmark's shapes, shrunk: this tests the command
        return median_ms(gang, dataclasses.replace(case, seq_len=64, heads=2, kv_heads=2,
                                                   head_dim=8, warmup=0, iters=1), *args)

    monkeypatch.setattr(checking, "median_ms", tiny)
    code, out, err = seqpar(monkeypatch, capsys, "check", "--bench", "--algorithms", "ring,ulysses")
    assert code == 0, out + err
    assert "each algorithm at P=1 against local" in out and "ring at P=2 against local" in out
    for row in ("local, 1 thread", "local, 2 threads", "ring P=2, 1 thread each"):
        assert row in out


def test_check_lengths_runs_both_policies_and_exits_0_with_json(session_gang, monkeypatch, capsys):
    """`seqpar check --lengths`: each algorithm's step under the static and the dynamic policy
    against one process; the default capacity makes the dynamic deal use more than one size."""
    code, out, err = seqpar(monkeypatch, capsys, "check", "-P", "2", "--algorithms", "ring",
                            "--heads", "4", "--kv-heads", "2", "--head-dim", "4", "--seed", "5",
                            "--lengths", "lognormal:mean=8,sigma=1,min=2,max=12", "--json")
    assert code == 0, out + err
    rows = json.loads(out)
    assert {(r["policy"], r["H/Hkv"]) for r in rows} == {
        (p, h) for p in ("static", "dynamic", "dynamic cost") for h in ("4/4", "4/2")}
    # group sizes by cost for ring and for auto (each size's algorithm named), MHA and GQA
    assert sorted(r["algorithm"].split()[0] for r in rows if r["policy"] == "dynamic cost") == [
        "auto", "auto", "ring", "ring"]
    assert all(r["status"] == "ok" and float(r["max rel grad err"]) < 1e-8 for r in rows), rows
    assert f"{len(rows)} of {len(rows)} steps exact" in err  # stdout is the JSON alone
    assert [(r["policy"], r["H/Hkv"]) for r in rows if r["states"] == "dist-opt"] == [
        ("dynamic", "4/2")]  # the dynamic step again, sharded by Megatron's distributed optimizer
    dynamic = next(r for r in rows if r["policy"] == "dynamic")
    assert dynamic["sequences by group size"].startswith("1:") and " 2:" in dynamic[
        "sequences by group size"]


@pytest.mark.parametrize(("args", "says"), [
    (["--lengths", "lognormal:mean=8,sigma=1,min=30,max=24"], "min=30 must be at most max=24"),
    (["--lengths", "fixed:64", "--capacity", "8"], "longer than the whole pool holds"),
    (["--lengths", "fixed:8", "--capacity", "0"], "capacity=0"),
])
def test_check_lengths_bad_input_is_one_line_and_exit_2(monkeypatch, capsys, args, says):
    code, out, err = seqpar(monkeypatch, capsys, "check", "-P", "2", *args)
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err
