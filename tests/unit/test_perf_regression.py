"""The planner's predictions stay what they were: a fixed table of configurations (clusters, models,
sequence lengths, worlds up to 256, every algorithm with the options that change its schedule,
attention and model scopes: the model scope's configurations are the search's, each with every
training policy) whose every predicted number is recorded in perf_regression.json and must be
reproduced to 1e-9 relative.

Re-record (only when a prediction is meant to change, saying why in the commit):
    .venv/bin/python tests/unit/test_perf_regression.py --record
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

FIXTURE = Path(__file__).with_name("perf_regression.json")

# (cluster, model, seq_len, world, nodes, scope, dtype, causal, every k-th usp option)
CASES: list[tuple[str, str, int, int, int, str, str, bool, int]] = [
    ("local", "tiny", 4096, 1, 1, "model", "float32", True, 1),
    ("local", "tiny", 4096, 4, 1, "model", "float32", True, 4),
    ("local", "tiny-gqa", 2048, 4, 2, "attention", "float32", False, 1),
    ("loongtrain-a100", "llama2-7b", 65536, 8, 1, "attention", "bfloat16", True, 1),
    ("burst-a800", "llama2-7b", 131072, 16, 2, "model", "bfloat16", True, 8),
    ("wallfacer-h100", "llama3-8b", 262144, 32, 4, "attention", "bfloat16", True, 2),
    ("wallfacer-a100-16", "llama3-70b", 1048576, 64, 4, "attention", "bfloat16", True, 3),
    ("wallfacer-a100-8", "14b", 524288, 64, 8, "model", "bfloat16", True, 24),
    ("loongtrain-a100", "llama2-7b", 1048576, 256, 32, "attention", "bfloat16", True, 4),
]


def _space(world: int, every: int) -> list[tuple[str, dict[str, Any]]]:
    from seqpar import algorithms

    out = []
    for name in algorithms.REGISTRY:
        if (name == "local") != (world == 1):
            continue
        opts = algorithms.option_space(name, world)
        if name == "usp":
            opts = opts[::every]
        out += [(name, o) for o in opts]
    return out


FIELDS = ("algorithm", "options", "layout", "attention_ms", "forward_ms", "compute_ms",
          "exposed_intra_ms", "exposed_inter_ms", "bytes_intra", "bytes_inter", "peak_mem_bytes",
          "fits", "bottleneck")
# the model scope (a whole step): the configuration, then every number of its prediction
STEP_FIELDS = ("algorithm", "options", "layout", "policy", "step_ms", "tgs", "mfu",
               "mfu_unmasked_attention", "hfu", "peak_mem_bytes", "fits", "attention",
               "attention_comm", "other_compute", "recompute", "exposed_comm", "optimizer",
               "states", "activations", "transient")
PART_FIELDS = slice(11, 17)


def _policy(policy: Any) -> dict[str, Any]:
    """A policy's fields as recorded: `ep` only where it is not 1 (the table's models are dense)."""
    return {k: v for k, v in policy.fields().items() if k != "ep" or v != 1}


def _num(x: Any) -> Any:
    return float(f"{x:.12g}") if isinstance(x, float) else x


def _row(p: Any) -> list[Any]:
    """Every number `seqpar plan --json` prints for a configuration (more digits than it prints:
    12 significant, so a change of 1e-9 shows), and what identifies the configuration."""
    if hasattr(p, "policy"):  # a whole step
        return [_num(x) for x in (
            p.algorithm, p.options, p.layout, _policy(p.policy), p.step_ms, p.tgs, p.mfu,
            p.mfu_unmasked_attention, p.hfu, p.peak_mem_bytes, p.fits,
            *(p.parts[k] for k in STEP_FIELDS[PART_FIELDS]),
            *(p.memory[k] for k in STEP_FIELDS[PART_FIELDS.stop:]))]
    return [_num(x) for x in (
        p.algorithm, p.options, p.layout, p.attention_ms, p.forward_ms, p.compute_ms,
        p.exposed_ms["intra"], p.exposed_ms["inter"], p.bytes_intra, p.bytes_inter,
        p.peak_mem_bytes, p.fits, p.bottleneck)]


def _cluster(name: str) -> Any:
    """The cluster as recorded (presets and the calibrated local host may be re-measured later:
    this test is about the model, not the numbers it is given)."""
    from seqpar.planner import clusters

    if FIXTURE.exists():
        return clusters.Cluster.model_validate(json.loads(FIXTURE.read_text())["clusters"][name])
    return clusters.load(name)


def predictions(case: tuple) -> list[list[Any]]:
    from seqpar.planner import plan

    cluster, model, seq_len, world, nodes, scope, dtype, causal, every = case
    ranked = plan.rank(_cluster(cluster), model, seq_len, world, _space(world, every),
                       nodes=nodes, scope=scope, dtype=dtype, causal=causal)
    return [_row(p) for p in ranked]


def _key(case: tuple) -> str:
    return " ".join(str(x) for x in case)


def _close(got: Any, want: Any) -> bool:
    if isinstance(want, float) and isinstance(got, (int, float)):
        return math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12)
    return got == want


@pytest.mark.parametrize("case", CASES, ids=_key)
def test_plan_predictions_match_the_recorded_table(case):
    want = json.loads(FIXTURE.read_text())[_key(case)]
    got = json.loads(json.dumps(predictions(case)))  # options as JSON holds them
    # the same configurations (in ranked order, but for ties broken by the last bit)
    n = 4 if case[5] == "model" else 3
    fields = STEP_FIELDS if case[5] == "model" else FIELDS
    by_config = {json.dumps(w[:n]): w for w in want}
    assert sorted(by_config) == sorted(json.dumps(g[:n]) for g in got)
    for g in got:
        w = by_config[json.dumps(g[:n])]
        bad = {f: (a, b) for f, a, b in zip(fields, g, w, strict=True) if not _close(a, b)}
        assert not bad, f"{g[:n]}: {bad}"


def test_the_recorded_table_covers_every_algorithm_and_both_scopes():
    from seqpar import algorithms

    table = json.loads(FIXTURE.read_text())
    assert set(table) == {_key(c) for c in CASES} | {"clusters"}
    del table["clusters"]
    algos = {r[0] for rows in table.values() for r in rows}
    assert algos == set(algorithms.REGISTRY)
    assert {c[3] for c in CASES} >= {64, 256} and {c[5] for c in CASES} == {"attention", "model"}


if __name__ == "__main__" and "--record" in sys.argv:
    from seqpar.planner import clusters

    FIXTURE.unlink(missing_ok=True)
    used = {c[0]: clusters.load(c[0]).model_dump(mode="json") for c in CASES}
    FIXTURE.write_text("{\n" + f'"clusters": {json.dumps(used)},\n' + ",\n".join(
        f"{json.dumps(_key(c))}: {json.dumps(predictions(c), separators=(',', ':'))}"
        for c in CASES) + "\n}\n")
    print(f"wrote {FIXTURE} ({FIXTURE.stat().st_size} bytes)")
