"""The planner's any-size groups (`seqpar plan --lengths --group-sizes any`, ByteScale's): dealt by
the runner's function (rules.deal.plan_batches with any_size), every size used at the options the
runner resolves for it (rules.pool.options_at), a size no configuration of an algorithm can run
refused as the runner refuses it, the choice in --json and the table, the default unchanged."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import get_args

import pytest
from typer.testing import CliRunner

from seqpar.cli.app import app
from seqpar.errors import ConfigError
from seqpar.experiments.spec import ParallelPlan
from seqpar.experiments.steps import make_case
from seqpar.planner import clusters
from seqpar.planner.lengths import Workload, deal_cost
from seqpar.planner.lengths_plan import LengthPlan
from seqpar.planner.lengths_step import GROUP_SIZES, Split
from seqpar.planner.lengths_time import predict_case
from seqpar.planner.policy import Filters
from seqpar.rules.deal import plan_batches
from seqpar.rules.lengths import parse
from seqpar.rules.pool import options_at, pool_sizes

ROOT = Path(__file__).resolve().parents[2]
MODEL = str(ROOT / "benchmarks" / "plan_lengths_model.yaml")  # 16 heads, 16 kv heads
LONG_TAIL = "lognormal:mean=1024,sigma=1.5,min=128,max=8192"
# P = 12 over 3 nodes, capacity 1,024: the longest sequence needs 8 ranks, so sizes 3, 5, 6, 7
# appear under any size (over a node: 5 to 7)
ARGS = ("plan", "--scope", "cluster", "--cluster", "h100-sxm", "--model", MODEL, "--world", "12",
        "--nodes", "3", "--seq-len", "8192", "--lengths", LONG_TAIL, "--tokens-per-step",
        "200000", "--capacity", "1024")


def plan_of(world: int = 12, capacity: int = 1024, seed: int | None = None) -> LengthPlan:
    work = Workload.of(LONG_TAIL, tokens=200_000, longest=8192, capacity=capacity,
                       seed=random.randrange(50) if seed is None else seed)
    return LengthPlan.make(clusters.load("h100-sxm"), MODEL, work, world, max(1, world // 4))


def test_the_words_are_the_sweeps():
    assert GROUP_SIZES == get_args(ParallelPlan.model_fields["group_sizes"].annotation)
    assert ParallelPlan.model_fields["group_sizes"].default == GROUP_SIZES[0]


def test_the_any_size_deal_is_the_runners():
    plan = plan_of()
    cost = deal_cost(plan.cfg, plan.cluster, "bfloat16", capacity=1024, world=12,
                     ranks_per_node=4, any_size=True)
    assert cost == plan.cost_of(True)
    # a ring's rates at every size the pool forms; the power-of-two ones as the default's
    assert {d for d, _ in cost.comm_at} == set(range(2, 13))
    assert set(plan.cost.comm_at) <= set(cost.comm_at)
    w = plan.work
    for equal in (False, True):
        runner = plan_batches(w.dist, w.tokens, w.longest, w.seed, w.batches, 12, 1024,
                              "dynamic", cost, ranks_per_node=4, any_size=True,
                              equal_counts=equal)
        tables = plan.tables(Split("dynamic", equal_counts=equal, any_size=True))
        assert [t.deal for t in tables] == [b.deal for b in runner]
    used = {m.size for t in tables for m in t.deal.micro if m.seqs}
    assert used - set(pool_sizes(12)), used  # a size that is not a power of two


def test_each_size_runs_what_the_runner_resolves_and_any_size_shows_its_sizes():
    plan = plan_of(world=12, capacity=2048, seed=3)
    steps = plan.search(Filters(algorithm="usp"), ("dynamic",), group_sizes="any")
    assert steps and all(s.split.any_size and s.json()["group_sizes"] == "any" for s in steps)
    free = [s for s in steps if not s.split.equal_counts]
    assert 3 in free[0].degrees  # 2,049-6,144 tokens: 3 ranks of 2,048, not 4
    for s in steps:
        for d, got in s.by_size.items():
            want = ("local", {}) if d == 1 else options_at(
                "usp", d, s.options, plan.cfg.heads, plan.cfg.kv_heads, plan.cfg.head_dim)
            assert got == want, (d, s.options)
    # the default is untouched: powers of two, the default's cost model, "power-of-two"
    default = plan.search(Filters(algorithm="usp"))
    assert not any(s.split.any_size for s in default)
    for s in default:
        assert s.json()["group_sizes"] == (None if s.sp_policy == "static" else "power-of-two")
        assert set(s.degrees) <= set(pool_sizes(12)) or s.sp_policy == "static"


def test_a_size_ulysses_cannot_run_is_refused_as_the_runner_refuses_it():
    plan = plan_of(world=12, capacity=2048, seed=3)
    assert not plan.search(Filters(algorithm="ulysses"), ("dynamic",), group_sizes="any")
    with pytest.raises(ConfigError) as runner:
        options_at("ulysses", 3, {}, 16, 16, 128)
    assert str(plan.unrunnable["ulysses"]) == str(runner.value)
    result = CliRunner().invoke(app, [*ARGS, "--capacity", "2048", "--algorithm", "ulysses",
                                      "--sp-policy", "dynamic", "--group-sizes", "any", "--json"])
    assert isinstance(result.exception, ConfigError), result.output
    assert str(result.exception).startswith("sp_group=3: ulysses cannot run on a group of 3")


def test_plan_json_carries_any_size_and_its_non_power_of_two_groups():
    result = CliRunner().invoke(app, [*ARGS, "--sp-policy", "dynamic", "--group-sizes", "any",
                                      "--algorithm", "ring", "--top", "3", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["group_sizes"] == "any"
    free = [c for c in out["configs"] if not c["equal_counts"]]
    assert free and all(c["group_sizes"] == "any" for c in out["configs"])
    sizes = {int(d) for d in free[0]["predicted"]["degrees"]}
    assert sizes & {3, 5, 6, 7} and set(free[0]["options_by_size"]) == {str(d) for d in sizes}


@pytest.mark.parametrize(("extra", "starts", "says"), [
    (("--sp-policy", "static", "--group-sizes", "any"), "group-sizes='any'",
     "the static policy runs one SP degree"),
    (("--group-sizes", "odd"), "group-sizes='odd'", "one of power-of-two, any"),
])
def test_bad_group_sizes_are_one_line(extra, starts, says):
    result = CliRunner().invoke(app, [*ARGS, *extra, "--json"])
    assert isinstance(result.exception, ConfigError), result.output
    text = str(result.exception)
    assert text.startswith(starts) and says in text and "\n" not in text, text


def test_group_sizes_needs_lengths():
    result = CliRunner().invoke(app, ["plan", "--scope", "cluster", "--group-sizes", "any"])
    assert isinstance(result.exception, ConfigError)
    assert str(result.exception).startswith("--group-sizes=True: needs --lengths")


def test_a_runs_any_size_deal_is_the_planners():
    """The driver deals a trial with `plan.group_sizes: any` by the cost model the planner's
    `--group-sizes any` uses (a ring's rates at every size; without them a size that is not a
    power of two fell back to the intra-node rate and the two deals differed)."""
    lengths, seed = "lognormal:mean=10,sigma=1,min=2,max=40", random.randrange(1000)
    case = make_case("ring", 6, lengths, tokens=200, capacity=8, policy="dynamic", seed=seed,
                     dtype="float32", any_size=True, longest=40, batches=2)
    cost = deal_cost(case.config(), clusters.load("local"), "float32", capacity=8, world=6,
                     any_size=True)
    want = plan_batches(parse(lengths, "lengths"), 200, 40, seed, 2, 6, 8, "dynamic", cost,
                        any_size=True)
    assert [b.deal for b in case.batches] == [b.deal for b in want]
    assert {m.size for b in want for m in b.deal.micro if m.seqs} - set(pool_sizes(6))
    # the trial says so, and `seqpar plan --validate` predicts it as an any-size step
    assert case.any_size and "any-size" in case.label()
    assert predict_case(case, clusters.load("local")).json()["group_sizes"] == "any"
