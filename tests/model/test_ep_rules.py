"""Expert parallelism's rules, on one process: bad input refused in one line before any rank
starts (the sweep spec and the model alike), the EP groups' placement, and the all-to-all rows
the ledger is held to."""

from __future__ import annotations

import random

import pytest

from seqpar.errors import ConfigError
from seqpar.experiments.spec import ExperimentSpec
from seqpar.model import Transformer, ep
from seqpar.rules.groups import edp_groups, ep_groups, ep_index, ep_rows, ep_within_nodes
from seqpar.rules.model import ModelConfig
from seqpar.workers.metrics import expert_imbalance

MOE = "tiny-qwen3-moe"  # 8 experts, 2 a token


def spec(**changes) -> dict:
    out = {"plan": {"algorithm": "ring", "world": 4, "ep": 2}, "workload": {"seq_len": 64},
           "train": {"model": MOE}}
    for key, value in changes.items():
        section, name = key.split("__")
        out.setdefault(section, {})[name] = value
    return out


@pytest.mark.parametrize(("changes", "field", "words"), [
    ({"train__model": "tiny"}, "plan.ep", "needs a mixture-of-experts model"),
    ({"plan__ep": 3}, "plan.ep", "must divide the DP x SP ranks (4)"),
    ({"plan__ep": 8, "plan__world": 8, "train__model": "tiny-gpt-oss", "train__dp": 2}, None, None),
    ({"plan__ep": 16, "plan__world": 16}, "plan.ep", "must divide the experts of each MoE layer"),
    ({"train__states": "zero1"}, "train.states", "must be one of replicated, fsdp"),
    ({"train__states": "dist-opt"}, "train.states", "must be one of replicated, fsdp"),
    ({"train__tiled": True}, "tiled", "must be false with ep 2"),
    ({"train__checkpoint": "sequence"}, "train.checkpoint", "must be one of none, full, sc++"),
    ({"plan__ep": 0}, "plan.ep", "greater than 0"),
])
def test_bad_ep_input_is_one_line_before_any_rank(changes, field, words):
    if field is None:  # the good one: 8 experts over 8 ranks, EP spanning replicas
        assert "EP=8" in ExperimentSpec.parse(spec(**changes)).label()
        return
    with pytest.raises(ConfigError) as err:
        ExperimentSpec.parse(spec(**changes))
    assert err.value.field == field and words in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


def test_ep_without_a_train_section_is_refused():
    data = {"model": "tiny", "plan": {"algorithm": "ring", "world": 4, "ep": 2},
            "workload": {"seq_len": 64}}
    with pytest.raises(ConfigError, match=r"plan.ep=2: spreads a model's experts"):
        ExperimentSpec.parse(data)


def test_ep_1_keeps_a_specs_hash():
    plain = spec()
    del plain["plan"]["ep"]
    assert ExperimentSpec.parse(plain).hash == ExperimentSpec.parse(spec(plan__ep=1)).hash
    assert ExperimentSpec.parse(spec()).hash != ExperimentSpec.parse(plain).hash


def test_the_model_refuses_ep_without_a_process_group_or_on_a_dense_model():
    with pytest.raises(ConfigError, match="ep=2: needs an initialised process group"):
        Transformer(ModelConfig.load(MOE), ep=2)
    with pytest.raises(ConfigError, match="needs a mixture-of-experts model"):
        ep.check(2, ModelConfig.load("tiny"), 4, "replicated")


def test_ep_groups_are_consecutive_ranks_sp_inner_and_edp_the_same_index():
    assert ep_groups(8, 4) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert edp_groups(8, 4) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert ep_index(6, 4) == (2, 1)
    assert ep_within_nodes(4, 8) and not ep_within_nodes(4, 2)
    for world, size in ((8, 2), (8, 8), (12, 3)):  # every rank in one EP and one EDP group
        assert sorted(sum(ep_groups(world, size), [])) == list(range(world))
        assert sorted(sum(edp_groups(world, size), [])) == list(range(world))


def test_the_all_to_all_rows_are_the_assignments_crossing_ranks():
    """By hand on 2 ranks, then against a direct count on random routing (4 ranks, EP 2)."""
    assert ep_rows([[1, 2, 3, 4], [0, 1, 0, 1]], 2) == [(7, 1), (1, 7)]
    rng = random.Random(5)
    counts = [[rng.randrange(6) for _ in range(8)] for _ in range(4)]
    for r, (sent, got) in enumerate(ep_rows(counts, 2)):
        mine = range(4 * (r % 2), 4 * (r % 2) + 4)
        peer = r ^ 1  # the other rank of its EP group
        assert sent == sum(counts[r]) - sum(counts[r][e] for e in mine)
        assert got == sum(counts[peer][e] for e in mine)
    # the group's rows sent equal its rows received (what leaves one rank arrives at another)
    rows = ep_rows(counts, 2)
    assert sum(s for s, _ in rows) == sum(g for _, g in rows)


def test_expert_imbalance_is_the_busiest_expert_over_the_mean_averaged_over_layers():
    # two ranks, two MoE layers, 4 experts: layer 0 summed [4, 4, 4, 4] (even), layer 1
    # [8, 0, 4, 4] (busiest 8 over a mean of 4)
    loads = [[[1, 3, 2, 2], [5, 0, 2, 1]], [[3, 1, 2, 2], [3, 0, 2, 3]]]
    assert expert_imbalance(loads) == pytest.approx((1.0 + 2.0) / 2)
    assert expert_imbalance([[[0, 0]]]) == 1.0  # no token: even, not 0 / 0
