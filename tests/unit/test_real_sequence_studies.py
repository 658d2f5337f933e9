"""The issue-12 studies (varlen, sliding-window, accuracy) expand into valid trials at both presets."""

from __future__ import annotations

import pytest

from seqpar import algorithms
from seqpar.experiments.registry import PRESET_NAMES, STUDIES

NAMES = ("varlen", "sliding-window", "accuracy")


def specs(name: str, preset: str) -> list:
    pts = STUDIES[name].points(preset)
    bad = [f"{p.label}: {p.error}" for p in pts if p.spec is None]
    assert not bad, bad  # every point of these presets is chosen to run
    return [p.spec for p in pts]


@pytest.mark.parametrize("preset", PRESET_NAMES)
def test_varlen_packs_long_tailed_documents_for_every_algorithm_and_layout(preset):
    ss = specs("varlen", preset)
    assert all(s.workload.documents is not None and s.workload.documents.count >= 8 for s in ss)
    multi = [s for s in ss if s.plan.world > 1]
    assert {s.plan.layout for s in multi} == {"contiguous", "zigzag", "stripe"}
    assert {s.plan.algorithm for s in multi} == set(algorithms.REGISTRY) - {"local"}
    cu = ss[0].to_case().cu_seqlens
    lengths = sorted(b - a for a, b in zip(cu, cu[1:], strict=False))
    assert lengths[-1] >= 10 * lengths[len(lengths) // 2]  # a few long, many short


@pytest.mark.parametrize("preset", PRESET_NAMES)
def test_sliding_window_sweeps_windows_against_full_causal(preset):
    ss = specs("sliding-window", preset)
    n = ss[0].workload.seq_len
    by_config: dict[tuple, set] = {}
    for s in ss:
        assert s.workload.causal
        by_config.setdefault((s.plan.algorithm, s.plan.world, s.plan.layout), set()).add(
            s.workload.window)
    for windows in by_config.values():
        assert windows == {None, n // 2, n // 8, n // 32}


@pytest.mark.parametrize("preset", PRESET_NAMES)
def test_accuracy_covers_every_algorithm_worlds_1_to_8_and_two_dtypes(preset):
    ss = specs("accuracy", preset)
    assert {s.workload.mode for s in ss} == {"accuracy"}
    assert {s.plan.world for s in ss} == set(range(1, 9))
    assert {s.workload.dtype for s in ss} == {"float32", "bfloat16"}
    assert {s.plan.algorithm for s in ss} == set(algorithms.REGISTRY)
    assert len({s.workload.seq_len for s in ss}) == 1 and len({s.workload.seed for s in ss}) == 1
    ring = {s.plan.world for s in ss if s.plan.algorithm == "ring"}
    assert ring == set(range(2, 9))


def test_cpu_presets_stay_small():
    for name in NAMES:
        ss = specs(name, "cpu")
        assert max(s.workload.seq_len for s in ss) <= 4096, name
        assert ss[0].model.heads == 8 and ss[0].env.device == "cpu"
