"""Every rule of a trial lives in its case's `validate()` (Case and TrainCase); the trial runner adds
only the run's (plan, link emulation, timeout). Each broken rule is a ConfigError naming its field."""

from __future__ import annotations

import pytest

from seqpar.algorithms.comm import LinkModel
from seqpar.case import Case, TrainCase
from seqpar.errors import ConfigError
from seqpar.workers.trial import validate


@pytest.mark.parametrize(("change", "field"), [
    ({"mode": "backward"}, "mode"),
    ({"dtype": "float8"}, "dtype"),
    ({"warmup": -1}, "warmup"),
    ({"iters": 0}, "iters"),
    ({"world": 0}, "world"),
    ({"window": 0}, "window"),
    ({"cu_seqlens": (0, 20, 40)}, "cu_seqlens"),   # must end at seq_len = 48
    ({"heads": 6, "kv_heads": 6}, "heads"),        # ulysses: heads divisible by the world
])
def test_case_validate_names_the_broken_rule(change, field):
    good = Case("ulysses", 4, seq_len=48, heads=4, kv_heads=4)
    good.validate()
    with pytest.raises(ConfigError) as err:
        Case(**{**good.__dict__, **change}).validate()
    assert err.value.field == field


@pytest.mark.parametrize(("change", "field"), [
    ({"sp": 0}, "sp"),
    ({"dp": 0}, "dp"),
    ({"dtype": "float8"}, "dtype"),
    ({"iters": 0}, "iters"),
    ({"warmup": -1}, "warmup"),
    ({"checkpoint": "sometimes"}, "checkpoint"),
])
def test_train_case_validate_names_the_broken_rule(change, field):
    good = TrainCase(algorithm="ring", sp=2, seq_len=64)
    good.validate()
    with pytest.raises(ConfigError) as err:
        TrainCase(**{**good.__dict__, **change}).validate()
    assert err.value.field == field


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"nodes": 3}, "nodes"),
    ({"link_emulation": {"wan": LinkModel(0.0, 1e9)}}, "link_emulation"),
    ({"link_emulation": {"inter": LinkModel(-1.0, 1e9)}}, "link_emulation[inter].latency_s"),
    ({"timeout_s": 0}, "timeout_s"),
])
def test_trial_adds_the_rules_of_the_run(kwargs, field):
    run = {"nodes": 1, "ranks_per_node": None, "link_emulation": None, "timeout_s": 60.0}
    case = Case("ring", 4)
    assert validate(case, **run) == 4
    with pytest.raises(ConfigError) as err:
        validate(case, **{**run, **kwargs})
    assert err.value.field == field


def test_trial_refuses_what_is_not_a_case_and_applies_the_case_rules():
    run = {"nodes": 1, "ranks_per_node": None, "link_emulation": None, "timeout_s": 60.0}
    with pytest.raises(ConfigError, match="case"):
        validate({"algorithm": "ring"}, **run)
    with pytest.raises(ConfigError) as err:
        validate(TrainCase(sp=2, dtype="float8"), **run)
    assert err.value.field == "dtype"
