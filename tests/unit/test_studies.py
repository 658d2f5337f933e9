"""The study registry: every study expands into valid specs (or says why not) at both presets."""

from __future__ import annotations

import pytest

from seqpar import algorithms, peers
from seqpar.errors import ConfigError
from seqpar.experiments.grid import apply, points
from seqpar.experiments.registry import PRESET_NAMES, STUDIES
from seqpar.rules.pool import AUTO

NAMES = ("throughput", "memory", "strong-scaling", "weak-scaling", "mha-vs-gqa", "load-balance",
         "placement", "ring-size", "wallfacer-c", "burst-backward")


def test_every_study_of_the_issue_is_registered():
    assert set(NAMES) <= set(STUDIES)


@pytest.mark.parametrize("preset", PRESET_NAMES)
@pytest.mark.parametrize("name", NAMES)
def test_study_expands_into_specs_or_reasons(name, preset):
    study = STUDIES[name]
    pts = study.points(preset)
    assert pts, name
    for p in pts:
        assert (p.spec is None) != (p.error is None)
    assert any(p.spec is not None for p in pts)


def test_cpu_presets_include_the_local_baseline_and_stay_small():
    for name in ("throughput", "memory", "strong-scaling", "weak-scaling"):
        specs = [p.spec for p in STUDIES[name].points("cpu") if p.spec]
        assert any(s.plan.algorithm == "local" for s in specs), name
        assert max(s.workload.seq_len for s in specs) <= 8192
        assert max(s.plan.world for s in specs) <= 4


def test_gpu_cluster_preset_is_the_papers_scale():
    specs = [p.spec for p in STUDIES["throughput"].points("gpu-cluster") if p.spec]
    assert max(s.workload.seq_len for s in specs) >= 1_000_000
    assert max(s.plan.world for s in specs) >= 8 and specs[0].model.heads == 32


def test_weak_scaling_grows_the_sequence_with_the_world():
    specs = [p.spec for p in STUDIES["weak-scaling"].points("cpu") if p.spec]
    ratio = {s.workload.seq_len // s.plan.world for s in specs if s.plan.algorithm == "ring"}
    assert len(ratio) == 1


def test_grid_named_axis_dotted_keys_and_model_preset_override():
    base = {"model": "tiny", "plan": {"world": 4}}
    pts = points({"plan.algorithm": ["ring", "ulysses"], "model.kv_heads": [8, 2],
                  "scale": [{"plan.world": 2, "workload.seq_len": 64}]})
    assert len(pts) == 4
    data = apply(base, pts[-1])
    assert data["model"] == {"preset": "tiny", "kv_heads": 2}
    assert data["plan"] == {"world": 2, "algorithm": "ulysses"}
    with pytest.raises(ConfigError, match="grid.scale"):
        apply(base, {"scale": 3})
    with pytest.raises(ConfigError, match="non-empty list"):
        points({"plan.world": 4})


def test_unknown_preset_is_rejected():
    with pytest.raises(ConfigError, match="preset='laptop'"):
        STUDIES["throughput"].sweep("laptop")


@pytest.mark.parametrize("preset", PRESET_NAMES)
def test_every_algorithm_a_study_names_is_registered(preset):
    """Read from each study's own grid, before any validation: an algorithm that is misspelt or not
    registered would only become a point skipped at run time (and a study that never runs it),
    which this test refuses."""
    known = set(algorithms.REGISTRY) | {p.name for p in peers.catalogue()} | {AUTO}
    for study in STUDIES.values():
        base, grid = study.sweep(preset)
        named = {apply(base, overrides)["plan"].get("algorithm") for overrides in points(grid)}
        assert named <= known, (study.name, sorted(named - known))
        unknown = [p for p in study.points(preset) if p.error and p.error.field == "plan.algorithm"
                   and "cannot run here" not in p.error.rule]  # a peer missing here is no typo
        assert unknown == [], (study.name, [str(p.error) for p in unknown])
