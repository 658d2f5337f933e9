"""Sweep files: YAML -> validated trials; bad input stops here, with one line naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from seqpar.errors import ConfigError
from seqpar.sweeps import spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(text)
    return path


def test_quickstart_is_four_algorithms_at_two_lengths_a_rank_per_core_of_two():
    plan = spec.load(EXAMPLES / "quickstart.yaml")
    assert plan.name == plan.experiment == "quickstart" and not plan.skipped
    combos = {(p.spec.plan.algorithm, p.spec.plan.world, p.spec.workload.seq_len) for p in plan.trials}
    assert combos == {(a, 1 if a == "local" else 2, n) for a in ("local", "allgather", "ulysses", "ring")
                      for n in (2048, 4096)}
    assert all(p.spec.workload.causal for p in plan.trials)


def test_every_example_file_loads():
    files = sorted(EXAMPLES.glob("*.yaml"))
    assert len(files) >= 11  # quickstart + one per study
    for path in files:
        plan = spec.load(path)
        assert plan.points, path


def test_study_file_merges_base_and_replaces_grid_axes(tmp_path):
    plan = spec.load(write(tmp_path, """
study: load-balance
base: {workload: {seq_len: 512}}
grid: {plan.algorithm: [ring]}
"""))
    assert plan.experiment == "load-balance" and plan.headline == "load_imbalance"
    assert {p.spec.plan.layout for p in plan.trials} == {"contiguous", "zigzag", "stripe"}
    assert {p.spec.plan.algorithm for p in plan.trials} == {"ring"}
    assert {p.spec.workload.seq_len for p in plan.trials} == {512}


def test_set_overrides_win_and_duplicates_collapse():
    plan = spec.from_study("throughput", sets=spec.parse_sets(["workload.seq_len=256",
                                                               "plan.layout=stripe"]))
    lens = [p.spec.workload.seq_len for p in plan.trials]
    assert set(lens) == {256}
    hashes = [p.spec.hash for p in plan.trials]
    assert len(hashes) == len(set(hashes))  # three seq_len axes values collapsed into one
    assert spec.parse_sets(["a.b=[1, 2]", "c=true", "d=x"]) == {"a.b": [1, 2], "c": True, "d": "x"}


def test_invalid_points_are_skipped_with_reason_or_fail_strict(tmp_path):
    path = write(tmp_path, """
base: {model: tiny, plan: {algorithm: ring, world: 4}, workload: {seq_len: 64}}
grid: {workload.seq_len: [64, 0]}
""")
    plan = spec.load(path)
    assert len(plan.trials) == 1 and len(plan.skipped) == 1
    assert "workload.seq_len=0" in str(plan.skipped[0].error)
    plan.check(strict=False)
    with pytest.raises(ConfigError, match=r"workload.seq_len=0.*\(point 2.*--strict\)"):
        plan.check(strict=True)


@pytest.mark.parametrize(("text", "match"), [
    ("base: {model: tiny\n  grid: [", "malformed YAML at line"),
    ("- just\n- a list\n", "must be a YAML mapping"),
    ("colour: red\nbase: {}\n", "colour='colour': unknown key"),
    ("study: everything\n", "study='everything'"),
    ("study: memory\npreset: laptop\n", "preset='laptop'"),
    ("base: {model: tiny, plan: {algorithm: ring, world: 4}, workload: {seq_len: 64}}\n"
     "grid: {workload.seq_len: 64}\n", "grid.workload.seq_len=64: must be a non-empty list"),
])
def test_malformed_sweep_files_are_one_line_errors(tmp_path, text, match):
    with pytest.raises(ConfigError, match=match) as info:
        spec.load(write(tmp_path, text)).check()
    assert "\n" not in str(info.value)


def test_missing_file():
    with pytest.raises(ConfigError, match="file='/nope.yaml': does not exist"):
        spec.load("/nope.yaml")
