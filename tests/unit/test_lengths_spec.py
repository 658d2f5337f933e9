"""Lengths as a workload (rules/lengths.py, the spec's fields): the compact forms, the seeded draw
of a step, one sampler for documents and lengths, every bad input in one line before any rank
starts, and old sweep files keeping their spec hashes."""

from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path

import pytest

from seqpar.errors import ConfigError
from seqpar.experiments.spec import ExperimentSpec
from seqpar.rules import lengths as L
from seqpar.sweeps import spec as sweep_spec

ROOT = Path(__file__).resolve().parents[2]
MODEL = {"heads": 4, "kv_heads": 2, "head_dim": 16}  # the tiny decoder's attention shape


def spec(plan: dict | None = None, workload: dict | None = None, train: dict | None = None):
    return {"model": MODEL, "plan": {"algorithm": "ring", "world": 2, **(plan or {})},
            "workload": {"seq_len": 256, **(workload or {})},
            **({"train": train} if train is not None else {"train": {"model": "tiny"}})}


def test_lognormal_draws_have_the_mean_and_sigma_they_are_given():
    rng = random.Random()
    mean, sigma = rng.choice([64.0, 500.0, 3000.0]), rng.choice([0.5, 1.0])
    dist = L.parse(f"lognormal:mean={mean},sigma={sigma},min=1,max=10000000")
    draws = dist.sample(20000, seed=rng.randrange(1000))
    assert statistics.mean(draws) == pytest.approx(mean, rel=0.05)
    logs = [math.log(x) for x in draws]
    assert statistics.stdev(logs) == pytest.approx(sigma, rel=0.05)
    clipped = L.parse(f"lognormal:mean={mean},sigma={sigma},min={int(mean / 2)},max={int(mean)}")
    assert set(clipped.sample(2000)) <= set(range(int(mean / 2), int(mean) + 1))


def test_a_step_holds_exactly_its_tokens_in_whole_sequences_seeded():
    dist = L.parse("lognormal:mean=300,sigma=1.5,min=16,max=4000")
    seed, tokens = random.randrange(100), random.choice([5000, 8192, 12345])
    batches = L.draw_batches(dist, tokens, 1024, seed, 3)
    assert batches == L.draw_batches(dist, tokens, 1024, seed, 3)  # the same on every rank
    assert batches != L.draw_batches(dist, tokens, 1024, seed + 1, 3)
    for b in batches:
        assert sum(s.length for s in b) == tokens
        assert max(s.length for s in b) <= 1024  # seq_len is the longest a step holds
        assert all(s.length >= 16 for s in b[:-1])  # only the last may be cut below min
    assert batches[0] != batches[1]


def test_text_lengths_are_the_documents_read_in_order(tmp_path):
    text = "\n\n".join("x" * n for n in (5, 17, 3, 40)) + "\n"
    path = tmp_path / "t.txt"
    path.write_text(text)
    dist = L.parse(f"text:{path}")
    assert dist.sample() == (5, 17, 3, 40)
    (first, second) = L.draw_batches(dist, 30, 100, 0, 2)
    assert [s.length for s in first] == [5, 17, 3, 5]  # the last cut to the tokens missing
    assert [s.source for s in second][:2] == [0, 1]  # read on, wrapping


def test_file_lengths_one_a_line_or_a_json_list(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.json"
    a.write_text("12\n7\n\n300\n")
    b.write_text(json.dumps([12, 7, 300]))
    assert L.parse(f"file:{a}").sample() == L.parse(f"file:{b}").sample() == (12, 7, 300)


def test_documents_are_lengths_scaled_into_one_pack():
    """workload.documents' draw takes the same normal deviates as the lognormal lengths."""
    seed, sigma = random.randrange(50), random.choice([0.5, 1.25])
    docs = L.split_total(8192, 16, sigma, seed)
    assert sum(docs) == 8192 and len(docs) == 16
    raw = L.LogNormal(100.0, sigma, 1, 10**12)
    rng = random.Random(seed)
    weights = [raw.mean * math.exp(sigma * rng.gauss(0, 1) - sigma ** 2 / 2) for _ in range(16)]
    shares = [1 + (8192 - 16) * w / sum(weights) for w in weights]  # a token each, the rest
    assert all(abs(d - s) <= 1.5 for d, s in zip(docs, shares, strict=True))
    plain = {"model": MODEL, "plan": {"algorithm": "ring", "world": 2}}
    a = ExperimentSpec.parse({**plain, "workload": {"seq_len": 1024, "documents": {
        "count": 5, "spread": 1.1, "seed": 2}}})
    b = ExperimentSpec.parse({**plain, "workload": {"seq_len": 1024, "documents": {
        "count": 5, "sigma": 1.1, "seed": 2}}})
    assert a.hash == b.hash and a.workload.cu_seqlens == b.workload.cu_seqlens


@pytest.mark.parametrize(("form", "says"), [
    ("lognormal:mean=64,sigma=1,min=100,max=50", "min=100 must be at most max=50"),
    ("lognormal:mean=64,sigma=-1,min=1,max=500", "sigma=-1 must be >= 0"),
    ("lognormal:mean=900,sigma=1,min=1,max=500", "mean=900 must lie in [min, max]"),
    ("lognormal:mean=64,sigma=1,min=1", "missing max"),
    ("fixed:0", "positive integer"),
    ("gamma:3", "must be one of fixed:N"),
    ("file:/no/such/file", "readable file"),
])
def test_bad_distributions_are_one_line_naming_the_field(form, says):
    with pytest.raises(ConfigError) as err:
        ExperimentSpec.parse(spec(workload={"lengths": form}))
    assert str(err.value).startswith("workload.lengths=") and says in str(err.value)
    assert "\n" not in str(err.value)


def test_bad_lengths_files(tmp_path):
    empty, words = tmp_path / "e.txt", tmp_path / "w.txt"
    empty.write_text("\n")
    words.write_text("12\nseven\n")
    for path, says in ((empty, "empty"), (words, "positive integers")):
        with pytest.raises(ConfigError, match=says):
            ExperimentSpec.parse(spec(workload={"lengths": f"file:{path}"}))


@pytest.mark.parametrize(("plan", "workload", "train", "field", "says"), [
    ({}, {"lengths": "fixed:64", "tokens_per_step": 10}, None, "workload.tokens_per_step",
     "shortest sequence (64"),
    ({"capacity": 10}, {"lengths": "fixed:64"}, None, "plan.capacity", "does not fit a static"),
    ({"sp_policy": "dynamic", "capacity": 10}, {"lengths": "fixed:64"}, None, "plan.capacity",
     "a sequence of 64 tokens is longer than the whole pool holds: 2 ranks x 10 tokens"),
    ({"capacity": 0}, {"lengths": "fixed:64"}, None, "plan.capacity", "greater than 0"),
    ({"sp_policy": "dynamic"}, {}, None, "plan.sp_policy", "needs workload.lengths"),
    ({}, {"lengths": "fixed:64"}, {}, "workload.lengths", "needs a train section"),
    ({}, {"lengths": "fixed:64", "documents": {"count": 3}}, None, "workload.documents",
     "does not combine with workload.lengths"),
    ({"sp_policy": "dynamic", "world": 3, "algorithm": "ulysses"}, {"lengths": "fixed:200"},
     None, "plan.world", "ulysses cannot run on a group of 3 ranks"),
    ({"sp_policy": "dynamic", "world": 4}, {"lengths": "fixed:64"},
     {"model": "tiny", "states": "fsdp"}, "train.states", "needs equal_counts"),
    ({"sp_policy": "dynamic", "world": 4}, {"lengths": "fixed:64"}, {"model": "tiny", "dp": 2},
     "train.dp", "must be 1 under the dynamic policy"),
])
def test_bad_steps_are_one_line_before_any_rank_starts(plan, workload, train, field, says):
    data = spec(plan, workload, {"model": "tiny"} if train is None else (train or None))
    if train == {}:
        data.pop("train")
    with pytest.raises(ConfigError) as err:
        ExperimentSpec.parse(data)
    assert str(err.value).startswith(f"{field}=") and says in str(err.value), str(err.value)


def test_a_dynamic_spec_carries_its_dealt_batches_and_a_hash_of_its_own():
    base = spec({"sp_policy": "dynamic", "world": 4, "capacity": 32},
                {"lengths": "lognormal:mean=40,sigma=1.2,min=4,max=128", "tokens_per_step": 512})
    case = ExperimentSpec.parse(base).to_case()
    assert len(case.batches) == 2 and case.capacity == 32
    assert all(sum(b.deal.lengths) == 512 for b in case.batches)
    assert all(b.deal.pool == 4 for b in case.batches)
    static = ExperimentSpec.parse({**base, "plan": {**base["plan"], "sp_policy": "static"}})
    assert static.hash != ExperimentSpec.parse(base).hash


# the hashes of shipped sweep files before lengths existed: new fields at their defaults leave them
OLD_HASHES = {"quickstart.yaml": ["76e1abb968e3", "7c2d7bf514ec", "4200619d7c0c", "e50a03a94760",
                                  "944e87df8273", "53e0199ca474", "5d0b02a74b28", "16ae37dca04b"],
              "gpu-train.yaml": ["397ce59c8b2f"]}


def test_old_sweep_files_keep_their_spec_hashes():
    for name, hashes in OLD_HASHES.items():
        assert [p.spec.hash for p in sweep_spec.load(ROOT / "examples" / name).points] == hashes
