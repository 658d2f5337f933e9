"""`seqpar plan --lengths`: a plan of long-tailed lengths (each SP policy and packing, its
imbalance, why the best wins) and its refusals."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from seqpar.cli.app import app
from tests.cli.plan_cli import plan_json
from tests.cli.plan_cli import plan_table as _table

LENGTHS = ("--scope", "cluster", "--cluster", "h100-sxm", "--model",
           "benchmarks/plan_lengths_model.yaml", "--world", "8", "--nodes", "2", "--seq-len",
           "8192", "--lengths", "lognormal:mean=1024,sigma=1.5,min=128,max=8192",
           "--tokens-per-step", "300000", "--capacity", "2048")


def test_plan_lengths_gives_each_policy_and_its_imbalance():
    out = plan_json(*LENGTHS, "--top", "0")
    assert out["lengths"] == "lognormal:mean=1024,sigma=1.5,min=128,max=8192"
    assert out["capacity"] == 2048 and out["tokens_per_step"] == 300000  # not a multiple of N
    configs = out["configs"]
    kinds = {(c["sp_policy"], c["packing"]) for c in configs}
    assert kinds == {("dynamic", "best-fit"), ("static", "best-fit"), ("static", "cost-balanced")}
    assert {c["sp"] for c in configs if c["sp_policy"] == "static"} >= {4, 8}  # 8,192 needs 4
    for c in configs:
        p = c["predicted"]
        assert c["capacity"] == 2048 and p["imbalance"] >= 1.0
        assert abs(sum(p["parts_ms"].values()) - p["step_ms"]) < 0.01
        assert abs(p["tgs"] - 300000 / (p["step_ms"] / 1e3 * 8)) < 0.01 * p["tgs"]
    fits = [c["fits"] for c in configs]
    assert fits == sorted(fits, reverse=True)
    only = plan_json(*LENGTHS, "--sp-policy", "static", "--packing", "cost-balanced")
    assert {(c["sp_policy"], c["packing"]) for c in only["configs"]} == {("static",
                                                                          "cost-balanced")}
    window = plan_json(*LENGTHS, "--mask", "window:512", "--sp-policy", "dynamic")
    best = {c["algorithm"]: c for c in window["configs"]}
    plain = {c["algorithm"]: c for c in plan_json(*LENGTHS, "--sp-policy", "dynamic")["configs"]}
    assert best["ring"]["predicted"]["parts_ms"]["attention"] < \
        plain["ring"]["predicted"]["parts_ms"]["attention"]


def test_plan_lengths_says_why_the_best_wins(monkeypatch):
    text = _table(monkeypatch, *LENGTHS, "--top", "5")
    assert "best: dynamic" in text and "vs best static" in text and "idle" in text
    assert "static SP degrees not planned: 1, 2: the longest" in text  # 8,192 > 2 x 2,048


@pytest.mark.parametrize(("extra", "starts", "says"), [
    (("--scope", "attention"), "scope=", "use --scope cluster"),
    (("--max-seq",), "max-seq=", "--seq-len is the longest a step holds"),
    (("--mask", "documents:100,200"), "mask=", "defined for one length"),
    (("--mask", "window:64:full"), "mask=", "causal or window:W"),
    (("--states", "node"), "states=", "replicated or FSDP"),
    (("--offload", "optimizer"), "offload=", "offloads nothing"),
    (("--checkpoint", "seq-attn:0.5"), "checkpoint=", "not lengths"),
    (("--sp-policy", "dynamic", "--packing", "cost-balanced"), "packing=", "static policy's"),
    (("--sp-policy", "elastic"), "sp-policy=", "static, dynamic"),
    (("--capacity", "0"), "capacity=0", "positive integer"),
    (("--capacity", "1000"), "capacity=1000", "longer than the whole pool holds: 8 ranks x 1000"),
    (("--tokens-per-step", "100"), "tokens-per-step=100", "shortest sequence (128"),
])
def test_plan_lengths_refusals_are_one_line(extra, starts, says):
    from seqpar.errors import ConfigError

    args = list(LENGTHS)
    for flag in ("--scope", "--capacity", "--tokens-per-step"):
        if flag in extra and flag in args:
            i = args.index(flag)
            del args[i:i + 2]
    result = CliRunner().invoke(app, ["plan", *args, *extra, "--json"])
    assert isinstance(result.exception, ConfigError), result.output
    assert str(result.exception).startswith(starts) and says in str(result.exception), \
        str(result.exception)
    assert "\n" not in str(result.exception)


def test_plan_lengths_options_need_lengths():
    from seqpar.errors import ConfigError

    for extra in (("--capacity", "64"), ("--sp-policy", "static"), ("--batches", "3")):
        result = CliRunner().invoke(app, ["plan", "--scope", "cluster", *extra, "--json"])
        assert isinstance(result.exception, ConfigError)
        assert "needs --lengths" in str(result.exception)


def test_plan_lengths_title_names_the_distributions_longest_sequence(monkeypatch):
    args = [*LENGTHS, "--sp-policy", "dynamic", "--batches", "1", "--top", "1"]
    del args[args.index("--seq-len"):args.index("--seq-len") + 2]  # --seq-len's 131,072 default
    title = " ".join(_table(monkeypatch, *args).split())
    assert "(longest 8,192)" in title and "131,072" not in title
    cut = " ".join(_table(monkeypatch, *args, "--seq-len", "4096", "--capacity", "1024").split())
    assert "(longest 4,096: --seq-len cuts the 8,192)" in cut
