"""A cluster is a checked record (`planner.record`): a plan of presets starts without pydantic,
and a cluster file or a cluster built in code is held to pydantic's rules in pydantic's words."""

from __future__ import annotations

import subprocess
import sys

import pydantic
import pytest
import yaml

from seqpar.errors import ConfigError
from seqpar.planner import clusters


def test_a_plan_of_presets_starts_without_pydantic():
    code = ("import sys, seqpar.cli.app, seqpar.cli.plan, seqpar.planner.clusters as c; "
            "c.load('h100-sxm'); print(sorted({'pydantic', 'yaml'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("change, said", [
    ({"memory_gb": -1}, "memory_gb=-1: Input should be greater than 0"),
    ({"foo": 1}, "foo=1: Extra inputs are not permitted"),
    ({"intra": 5}, "intra=5: Input should be a valid dictionary or instance of Link"),
    ({"inter": {"bandwidth_gb_per_s": 1, "latency_us": -1}},
     "inter.latency_us=-1: Input should be greater than or equal to 0"),
    ({"nodes": 8.5}, "nodes=8.5: Input should be a valid integer, got a number with a fractional"),
    ({"waits_us": {2: ["a", 1]}}, "waits_us.2.tuple[float, float].0='a': Input should be a valid "
                                  "number"),
])
def test_a_cluster_file_is_refused_in_pydantics_words(tmp_path, change, said):
    fields = {**clusters.load("h100-sxm").model_dump(mode="json"), **change}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(fields))
    with pytest.raises(ConfigError, match="cluster bad.yaml: ") as err:
        clusters.load(str(path))
    assert said in str(err.value)


def test_a_cluster_file_takes_what_pydantic_converts(tmp_path):
    fields = clusters.load("local").model_dump(mode="json")  # int keys as strings, tuples as lists
    fields |= {"nodes": "2", "memory_gb": 24, "intra": {"bandwidth_gb_per_s": 3}}
    path = tmp_path / "ok.yaml"
    path.write_text(yaml.safe_dump(fields))
    got = clusters.load(str(path))
    assert got.nodes == 2 and got.memory_gb == 24.0 and type(got.memory_gb) is float
    assert got.intra == clusters.Link(bandwidth_gb_per_s=3.0, latency_us=5.0)
    assert got.waits_us == clusters.load("local").waits_us  # {2: (a, b, c)}: int keys, tuples


def test_a_cluster_built_in_code_is_checked_and_converted():
    a100 = clusters.load("loongtrain-a100")
    fields = {f: getattr(a100, f) for f in ("name", "attention_tflops", "gemm_tflops", "memory_gb",
                                            "intra", "inter")}
    built = clusters.Cluster(**{**fields, "memory_gb": 40, "waits_us": {2: (1, 2)}})
    assert type(built.memory_gb) is float and built.waits_us == {2: (1.0, 2.0)}
    assert clusters.Cluster.model_validate_json(built.model_dump_json()) == built
    for bad, said in (({"memory_gb": 0}, "greater than 0"), ({"bogus": 1}, "Extra inputs"),
                      ({"intra": {"latency_us": 1}}, "Field required")):
        with pytest.raises(pydantic.ValidationError, match=said):
            clusters.Cluster(**{**fields, **bad})
    with pytest.raises(pydantic.ValidationError, match="Field required"):
        clusters.Link()
    assert str(a100.intra) == "bandwidth_gb_per_s=240.0 latency_us=5.0"  # pydantic's str
    assert a100.model_copy(update={"memory_gb": 40}).memory_gb == 40  # a copy is not checked
