"""Every rule of a trial lives in its case's `validate()` (Case and TrainCase) and in `case.Trial`
(the placement: nodes, links, timeout, variables, gang id), checked once, when the trial is made.
Each broken rule is a ConfigError naming its field."""

from __future__ import annotations

import pytest

from seqpar.algorithms.comm import LinkModel
from seqpar.case import Case, TrainCase, Trial
from seqpar.errors import ConfigError


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
    ({"nodes": 2, "ranks_per_node": 3}, "ranks_per_node"),
    ({"links": {"wan": LinkModel(0.0, 1e9)}}, "link_emulation"),
    ({"links": {"inter": LinkModel(-1.0, 1e9)}}, "link_emulation[inter].latency_s"),
    ({"timeout_s": 0}, "timeout_s"),
    ({"gang_id": "a:b"}, "gang_id"),
    ({"env_vars": {"NCCL SOCKET": "eth0"}}, "env_vars"),
])
def test_a_trial_is_validated_when_it_is_made(kwargs, field):
    good = Trial(Case("ring", 4), "g", nodes=2, links={"inter": LinkModel(1e-3, 1e9)})
    assert good.ranks_per_node == 2 and good.link_models == {"inter": LinkModel(1e-3, 1e9)}
    with pytest.raises(ConfigError) as err:
        Trial(**{"case": Case("ring", 4), "gang_id": "g", **kwargs})
    assert err.value.field == field


def test_a_trial_refuses_what_is_not_a_case_and_applies_the_case_rules():
    with pytest.raises(ConfigError, match="case"):
        Trial({"algorithm": "ring"}, "g")
    with pytest.raises(ConfigError) as err:
        Trial(TrainCase(sp=2, dtype="float8"), "g")
    assert err.value.field == "dtype"


def test_a_trial_moves_to_another_gang_unchanged_and_unchecked(monkeypatch):
    trial = Trial(Case("ring", 4), "g", env_vars={"B": "2", "A": "1"}, timeout_s=9.0)
    assert trial.env_vars == (("A", "1"), ("B", "2"))  # one form: sorted pairs
    monkeypatch.setattr(Case, "validate", lambda self: pytest.fail("validated again"))
    moved = trial.in_gang("sweep-1")
    assert moved.gang_id == "sweep-1" and moved.case is trial.case
    assert (moved.env, moved.timeout_s, moved.ranks_per_node) == ({"A": "1", "B": "2"}, 9.0, 4)
    with pytest.raises(ConfigError, match="gang_id"):
        trial.in_gang("")
