"""`seqpar check --model FILE` as a user runs it: a family's config.json shrunk to its tiny model,
every chosen algorithm and layout, a fixed-length step and steps of lengths under both policies,
against the one-process model in float64 with the bytes held to the analytic count; bad input one
line, exit 2, before any rank starts."""

from __future__ import annotations

import contextlib
import dataclasses
import json

import pytest

from seqpar.model import ModelConfig
from seqpar.rules.model import from_hf
from seqpar.workers.measure import check_model
from tests.cli.test_cli_check import seqpar
from tests.multirank.test_family_exactness import FAMILIES

GEMMA = {**FAMILIES["gemma3"], "num_hidden_layers": 6, "sliding_window": 1024,
         "layer_types": None, "hidden_size": 256, "num_attention_heads": 16,
         "num_key_value_heads": 8, "head_dim": 32, "vocab_size": 4096}  # 5 sliding : 1 full


def _gemma() -> dict:
    return {k: v for k, v in GEMMA.items() if v is not None}


@pytest.fixture
def session_gang(gang, monkeypatch):
    from seqpar.platform import localgang

    monkeypatch.setattr(localgang, "LocalGang", lambda *a, **k: contextlib.nullcontext(gang))


@pytest.mark.multirank
def test_a_gemma3_config_checks_exact_and_counts(session_gang, monkeypatch, capsys, tmp_path):
    """A Gemma 3 config.json (5 sliding layers to 1 full): its tiny model keeps one period of the
    pattern; ring in zigzag and balanced at P = 2 — balanced skipped with the model's reason (its
    layers' windows differ) — and ring's steps under both policies, every one exact."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_gemma()))
    code, out, err = seqpar(monkeypatch, capsys, "check", "--model", str(path), "-P", "2",
                            "--algorithms", "ring", "--layouts", "zigzag,balanced", "--json",
                            "--seed", "5")
    assert code == 0, out + err
    rows = json.loads(out)
    assert [(r["step"], r["layout"]) for r in rows] == [
        ("fixed", "zigzag"), ("static", "zigzag"), ("dynamic", "zigzag"), ("fixed", "balanced")]
    for r in rows[:3]:
        assert r["status"] == "ok" and r["bytes, busiest rank (fixed: fwd/bwd)"].endswith("✓"), r
    assert "different windows" in rows[3]["status"]
    assert "3 of 3 cases exact, 1 skipped" in err


def test_the_tiny_model_keeps_the_familys_fields_and_one_period_of_its_layers():
    cfg = ModelConfig.load("qwen3-30b-a3b")
    tiny = check_model.tiny_of(cfg, 4)
    assert (tiny.family, tiny.qk_norm, tiny.norm_topk) == (cfg.family, True, cfg.norm_topk)
    assert tiny.heads == 12 and tiny.heads // tiny.kv_heads > 1 and tiny.layers == 2
    assert tiny.experts == 8 and tiny.experts_per_tok == 4  # a choice, as the family's is
    assert tiny.head_dim * tiny.heads != tiny.hidden  # a free head_dim stays free
    gemma = check_model.tiny_of(from_hf(_gemma()), 3)
    assert gemma.layer_types == ("sliding",) * 5 + ("full",) and gemma.window == 5
    dense_first = dataclasses.replace(cfg, moe_layers=tuple(range(1, cfg.layers)))
    assert check_model.tiny_of(dense_first).moe_layers == (1,)  # no period: each kind met once


@pytest.mark.parametrize(("args", "says"), [
    (["--model", "no/such/config.json"], "model='no/such/config.json': no such file"),
    (["--model", "tiny", "-P", "1"], "world=1: must be at least 2 with --model"),
    (["--model", "CONFIG"], "ssm_state_size=16: state-space (Mamba) layers are not modelled"),
])
def test_bad_input_is_one_line_before_any_rank_starts(monkeypatch, capsys, tmp_path, args, says):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**FAMILIES["qwen3"], "ssm_state_size": 16}))
    started = []
    monkeypatch.setattr("seqpar.platform.localgang.LocalGang", lambda *a, **k: started.append(1))
    code, out, err = seqpar(monkeypatch, capsys, "check",
                            *[str(path) if a == "CONFIG" else a for a in args])
    assert code == 2 and not started, out + err
    assert says in err and len(err.strip().splitlines()) == 1, err
