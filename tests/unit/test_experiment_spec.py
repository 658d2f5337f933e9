"""ExperimentSpec: presets, the algorithms' own rules, one-line errors, a stable content hash."""

from __future__ import annotations

import pytest

from seqpar.case import Case
from seqpar.errors import ConfigError
from seqpar.experiments.spec import ExperimentSpec
from seqpar.rules.shape import SHAPE_PRESETS


def spec_data(**over) -> dict:
    data = {"model": "tiny", "plan": {"algorithm": "ring", "world": 4},
            "workload": {"seq_len": 1024}}
    for key, value in over.items():
        section, field = key.split("__")
        data[section] = {**data[section], field: value} if isinstance(data[section], dict) else \
            {**SHAPE_PRESETS[data[section]], field: value}
    return data


def test_a_spec_is_validated_once_into_the_trial_every_runner_carries(monkeypatch):
    data = spec_data(plan__nodes=2)
    data["env"] = {"timeout_s": 30.0, "link_emulation": {
        "inter": {"latency_us": 20.0, "bandwidth_gb_per_s": 1.0}}}
    calls: list[int] = []
    real = Case.validate
    monkeypatch.setattr(Case, "validate", lambda self: calls.append(1) or real(self))
    spec = ExperimentSpec.parse(data)
    assert calls == [1]
    trial = spec.to_trial("sweep-1")
    assert calls == [1]  # placing it in a gang checks nothing again
    assert (trial.gang_id, trial.nodes, trial.ranks_per_node, trial.timeout_s) == (
        "sweep-1", 2, 2, 30.0)
    assert trial.link_models == spec.env.link_models() and trial.case is spec.to_case()


def test_preset_expands_and_becomes_the_case_the_workers_run():
    spec = ExperimentSpec.parse({"model": "llama3-8b", "plan": {"algorithm": "ulysses", "world": 4},
                                 "workload": {"seq_len": 4096, "dtype": "bfloat16"}})
    case = spec.to_case()
    assert (case.heads, case.kv_heads, case.head_dim) == (32, 8, 128)
    assert (case.algorithm, case.world, case.seq_len, case.dtype) == ("ulysses", 4, 4096, "bfloat16")
    assert spec.shape.elem_bytes == 2


def test_hash_is_stable_and_changes_with_what_is_measured_only():
    a = ExperimentSpec.parse(spec_data())
    same = ExperimentSpec.parse({"model": {"heads": 8, "kv_heads": 8, "head_dim": 32},
                                 "plan": {"world": 4, "algorithm": "ring"},
                                 "workload": {"seq_len": 1024}})
    assert a.hash == same.hash == ExperimentSpec.parse(spec_data()).hash
    assert a.hash != ExperimentSpec.parse(spec_data(workload__seq_len=2048)).hash
    timeout = spec_data()
    timeout["env"] = {"timeout_s": 10.0}
    assert ExperimentSpec.parse(timeout).hash == a.hash  # a timeout does not change the numbers


def test_flat_params_name_every_field_with_dotted_keys():
    data = spec_data()
    data["env"] = {"link_emulation": {"inter": {"latency_us": 20.0, "bandwidth_gb_per_s": 1.0}}}
    flat = ExperimentSpec.parse(data).flat()
    assert flat["plan.algorithm"] == "ring" and flat["workload.seq_len"] == 1024
    assert flat["model.kv_heads"] == 8 and flat["env.link_emulation.inter.bandwidth_gb_per_s"] == 1.0
    models = ExperimentSpec.parse(data).env.link_models()
    assert models["inter"].bandwidth_bytes_per_s == 1e9
    assert models["inter"].latency_s == pytest.approx(20e-6)


@pytest.mark.parametrize(("data", "field", "rule"), [
    (spec_data(plan__algorithm="tree"), "plan.algorithm", "must be one of"),
    (spec_data(plan__layout="spiral"), "plan.layout", "must be one of"),
    (spec_data(model__kv_heads=3), "model.kv_heads", "must divide heads=8"),
    (spec_data(workload__seq_len=0), "workload.seq_len", "greater than 0"),
    (spec_data(plan__algorithm="local"), "plan.world", "world must be 1"),
    (spec_data(workload__iters=-1), "workload.iters", "greater than 0"),
    (spec_data(plan__world="4"), "plan.world", "valid integer"),
    (spec_data(plan__colour="red"), "plan.colour", "unknown key"),
    (spec_data(plan__options={"dhp": 2}), "plan.options", "ring takes"),
    (spec_data(plan__nodes=3), "plan.nodes", "must divide the world size (4)"),
    (spec_data(plan__ranks_per_node=3), "plan.ranks_per_node",
     "must equal the world size (4)"),
    (spec_data(workload__dtype="int8"), "workload.dtype", "must be one of"),
    (spec_data(workload__mode="bwd"), "workload.mode", "'fwd', 'fwd+bwd' or 'accuracy'"),
    ({"model": "gpt5", "plan": {"algorithm": "ring", "world": 4}, "workload": {"seq_len": 64}},
     "model.preset", "must be one of tiny"),
    ({"model": "tiny", "plan": {"algorithm": "ring", "world": 4}, "workload": {}},
     "workload.seq_len", "is required"),
])
def test_bad_specs_raise_one_line_naming_field_value_and_rule(data, field, rule):
    with pytest.raises(ConfigError) as info:
        ExperimentSpec.parse(data)
    assert info.value.field == field
    assert rule in info.value.rule
    assert "\n" not in str(info.value)


def test_env_vars_are_names_and_values_that_key_the_trial():
    data = spec_data()
    data["env"] = {"vars": {"NCCL_SOCKET_IFNAME": "eth0"}}
    spec = ExperimentSpec.parse(data)
    assert spec.env.vars == {"NCCL_SOCKET_IFNAME": "eth0"}
    assert spec.to_trial("g").env == {"NCCL_SOCKET_IFNAME": "eth0"}
    assert spec.hash != ExperimentSpec.parse(spec_data()).hash
    data["env"] = {"vars": {"NCCL SOCKET": "eth0"}}
    with pytest.raises(ConfigError, match="env.vars"):
        ExperimentSpec.parse(data)
