"""workload.documents and workload.window: validated in one line before any actor starts, carried
into the Case the ranks run, any length with documents, and the seeded long-tailed draw."""

from __future__ import annotations

import statistics

import pytest

from seqpar.errors import ConfigError
from seqpar.experiments.spec import ExperimentSpec
from seqpar.rules.lengths import boundaries
from seqpar.rules.lengths import split_total as draw_lengths


def spec(workload: dict | None = None, plan: dict | None = None, model="tiny", **extra) -> dict:
    return {"model": model, "plan": {"algorithm": "ring", "world": 4, **(plan or {})},
            "workload": {"seq_len": 1024, **(workload or {})}, **extra}


def test_drawn_documents_are_long_tailed_seeded_and_fill_the_sequence():
    lengths = draw_lengths(8192, 16, 1.25, seed=0)
    assert sum(lengths) == 8192 and len(lengths) == 16 and min(lengths) >= 1
    assert lengths == draw_lengths(8192, 16, 1.25, seed=0)  # the same seed, the same documents
    assert lengths != draw_lengths(8192, 16, 1.25, seed=1)
    assert max(lengths) > 5 * statistics.median(lengths)  # a few long, many short
    assert set(draw_lengths(8192, 16, 0.0, seed=3)) == {512}  # spread 0: equal documents
    assert draw_lengths(5, 5, 2.0, seed=0) == (1, 1, 1, 1, 1)
    assert boundaries((3, 1, 4)) == (0, 3, 4, 8)


def test_documents_and_window_reach_the_case_and_the_hash():
    s = ExperimentSpec.parse(spec({"documents": {"count": 5, "seed": 2}, "window": 128}))
    case = s.to_case()
    assert case.window == 128 and len(case.cu_seqlens) == 6
    assert case.cu_seqlens == boundaries(draw_lengths(1024, 5, 1.25, 2))
    assert "docs=5 W=128" in s.label()
    plain = ExperimentSpec.parse(spec())
    assert plain.to_case().cu_seqlens == () and plain.to_case().window is None
    other_seed = ExperimentSpec.parse(spec({"documents": {"count": 5, "seed": 3}, "window": 128}))
    assert len({plain.hash, s.hash, other_seed.hash}) == 3
    given = ExperimentSpec.parse(spec({"documents": {"lengths": [1000, 24]}}))
    assert given.to_case().cu_seqlens == (0, 1000, 1024)
    assert given.flat()["workload.documents.lengths"] == [1000, 24]


@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "stripe"])
def test_any_length_runs_in_every_layout_with_or_without_documents(layout):
    plain = ExperimentSpec.parse(spec({"seq_len": 1036}, {"layout": layout})).to_case()
    assert plain.cu_seqlens == ()  # 4 x 259: a plain call, though 1036 is no multiple of 8
    uneven = ExperimentSpec.parse(spec({"seq_len": 1001}, {"layout": layout})).to_case()
    one = ExperimentSpec.parse(spec({"seq_len": 1001, "documents": {"count": 1}},
                                    {"layout": layout})).to_case()
    assert uneven.cu_seqlens == one.cu_seqlens == (0, 1001)  # uneven shards: one document


def test_with_documents_any_length_parses_for_every_algorithm():
    for name in ("ulysses", "ring", "usp", "allgather"):
        ExperimentSpec.parse(spec({"seq_len": 1001, "documents": {"count": 3}}, {"algorithm": name}))


@pytest.mark.parametrize(("data", "field", "value", "rule"), [
    (spec({"window": 0}), "workload.window", 0, "greater than 0"),
    (spec({"window": 64, "causal": False}), "workload.window", 64, "needs causal=true"),
    (spec({"documents": {"count": 2, "lengths": [1024]}}), "workload.documents",
     {"count": 2, "lengths": [1024]}, "either count"),
    (spec({"documents": {}}), "workload.documents", {"count": None, "lengths": None},
     "either count"),
    (spec({"documents": {"lengths": [1000, 20]}}), "workload.documents.lengths", [1000, 20],
     "must sum to seq_len=1024 (they sum to 1020)"),
    (spec({"documents": {"lengths": [1024, 0]}}), "workload.documents.lengths", [1024, 0],
     "positive lengths"),
    (spec({"documents": {"count": 2000}}), "workload.documents.count", 2000,
     "at most seq_len=1024"),
    (spec({"documents": {"count": 0}}), "workload.documents.count", 0, "greater than 0"),
    (spec({"documents": {"count": 4, "spread": -1.0}}), "workload.documents.spread", -1.0,
     "greater than or equal to 0"),
    (spec({"documents": {"count": 4, "shape": 2}}), "workload.documents.shape", "shape",
     "unknown key"),
    (spec({"documents": {"count": 3}}, train={"model": "tiny"}), "workload.documents",
     {"count": 3, "spread": 1.25, "seed": 0}, "a training trial"),
    (spec({"mode": "accuracy"}, train={"model": "tiny"}), "workload.mode", "accuracy",
     "a training trial"),
])
def test_bad_documents_and_windows_raise_one_line(data, field, value, rule):
    with pytest.raises(ConfigError) as info:
        ExperimentSpec.parse(data)
    err = info.value
    assert (err.field, err.value) == (field, value)
    assert rule in err.rule
    assert "\n" not in str(err)
