"""The operation table (`seqpar/rules/ops_table.json`) against a fresh count of the running code:
every algorithm at two group sizes, a decoder layer (LLaMA's, MLA's and a linear one's; a family's
features over LLaMA's), the delta rule, LASP-2's and LASP-1's exchange, a micro-batch's head and
the optimizer. A red test means the
code changed its operations: regenerate the table with `python -m seqpar.workers.measure.optable
--write` (and read the diff)."""

from __future__ import annotations

import pytest

from seqpar.rules import ops
from seqpar.workers.measure import optable, optable_kinds

REGENERATE = ("the code and rules/ops_table.json disagree: "
              "python -m seqpar.workers.measure.optable --write")
CALLS = [(name, d) for name in optable.ALGORITHMS if name != "local" for d in (2, 4)]
COUNTED = ("ops", "kernel_calls", "kernel_ops", "collectives", "messages", "syncs")


def _fields(counts: dict) -> dict:
    return {f: counts[f] for f in COUNTED}


@pytest.mark.parametrize(("name", "d"), CALLS)
def test_attention_count_matches_the_table(gang, name, d):
    fresh = optable.attention_counts(gang, name, d, "zigzag", "causal")
    row = ops.table()["attention"][ops.attention_key(name, d, "zigzag", "causal")]
    for phase in ops.PHASES:
        assert _fields(fresh[phase]) == _fields(row[phase]), f"{name} d={d} {phase}: {REGENERATE}"
        issue = ops.attention(name, d, layout="zigzag", mask="causal", phase=phase)
        assert (issue.ops, issue.kernel_calls, issue.collectives, issue.messages) == (
            fresh[phase]["ops"], fresh[phase]["kernel_calls"], fresh[phase]["collectives"],
            fresh[phase]["messages"])


def test_documents_and_window_counts_match_the_table(gang):
    for mask, docs in (("documents", 4), ("window", 1)):
        fresh = optable.attention_counts(gang, "ring", 2, "zigzag", mask, docs)
        row = ops.table()["attention"][ops.attention_key("ring", 2, "zigzag", mask, docs)]
        for phase in ops.PHASES:
            assert _fields(fresh[phase]) == _fields(row[phase]), f"ring {mask}: {REGENERATE}"


def test_ring_law_gives_the_sizes_it_was_not_derived_from():
    law = ops.table()["laws"][ops.law_key("ring", "zigzag", "causal")]
    assert law["law_holds"] == {"3": True, "8": True}
    for phase in ops.PHASES:
        row = ops.table()["attention"][ops.attention_key("ring", 8, "zigzag", "causal")][phase]
        a, b = law["law"][phase]["messages"]
        assert a + b * 7 == row["messages"]
    # a size the table has not measured comes from the law: 16 ranks, 15 ring steps
    assert ops.attention("ring", 16, phase="forward").kernel_calls == 16


def test_layer_and_head_counts_match_the_table():
    blocks = optable.measure_blocks()
    for mode in ("none", "full"):
        for phase in ops.PHASES:
            assert _fields(blocks["blocks"][mode][phase]) == _fields(
                ops.table()["blocks"][mode][phase]), f"block {mode} {phase}: {REGENERATE}"
    for phase in ops.PHASES:
        assert _fields(blocks["micro"]["unfused"][phase]) == _fields(
            ops.table()["micro"]["unfused"][phase]), REGENERATE
    assert ops.attention_reruns("full") == 1.0 and ops.attention_reruns("sc++") == 0.0


def test_layer_kinds_and_lasp_counts_match_the_table(gang):
    """An MLA block, a linear block and the delta rule at 3 chunks (a law's check point), LASP-2 at
    2 ranks and LASP-1 at 3: fresh counts against the table's rows, through `rules.ops`."""
    kinds = ops.table()["kinds"]
    assert _fields(optable_kinds.kind_block("mla")["backward"]) == _fields(
        kinds["mla|none"]["backward"]), f"mla block: {REGENERATE}"
    linear, rule = optable_kinds.kind_block("linear", chunks=3), optable_kinds.count_rule(3)
    for phase in ops.PHASES:
        assert ops.block(phase=phase, kind="linear", chunks=3).ops == linear[phase]["ops"], (
            f"linear block {phase}: {REGENERATE}")
        assert _fields(rule[phase]) == _fields(kinds["rule"]["points"]["3"][phase]), REGENERATE
    for mode, d in (("lasp2", 2), ("lasp1", 3)):
        fresh = optable_kinds.lasp_counts(gang, mode, d)
        for phase in ops.PHASES:
            issue = ops.lasp(mode, d, phase)
            assert (issue.ops, issue.collectives, issue.messages) == (
                fresh[phase]["ops"], fresh[phase]["collectives"], fresh[phase]["messages"]), (
                f"{mode} d={d} {phase}: {REGENERATE}")
    # the laws give the points they were not derived from
    assert kinds["linear|none"]["holds"] and ops.table()["lasp"]["lasp2"]["holds"]


def test_family_features_match_the_table():
    """Features' rows (QK-norm over LLaMA's norms and Gemma's, the norms, the sinks) and each
    preset's combination measured whole (Qwen3-Next's gated layer, Gemma 3's, gpt-oss's; Gemma
    3's under a full checkpoint too): fresh counts against `rules.ops.block`'s."""
    gemma = ("qk_norm", "sandwich_norms", "norm_offset", "gelu_tanh")
    combos = optable_kinds.preset_combinations()
    assert gemma in combos and len(combos) >= 3
    cases = [(("qk_norm",), "none"), (("sinks",), "none"), (("norm_offset", "qk_norm"), "none"),
             *((names, "none") for names in combos), (gemma, "full")]
    llama = {mode: optable_kinds.feature_block((), mode) for mode in ("none", "full")}
    for names, mode in cases:
        fresh = optable_kinds.feature_block(names, mode)
        for phase in ops.PHASES:
            want = ops.block(mode, phase, features=names) + ops.block(mode, phase) * -1.0
            assert (want.ops, want.kernel_calls, want.syncs) == tuple(
                fresh[phase][f] - llama[mode][phase][f] for f in ("ops", "kernel_calls", "syncs")
            ), f"{'+'.join(names)} {mode} {phase}: {REGENERATE}"


def test_each_feature_is_read_from_the_config_it_is_measured_on():
    for name in ops.FEATURES:
        assert ops.layer_features(optable_kinds.feature_config((name,), 2), 1) == (name,)
    assert ops.layer_features(optable_kinds.feature_config((), 2), 1) == ()


def test_optimizer_counts_match_the_table():
    for kind, foreach in (("per-parameter", False), ("foreach", True)):
        params, counts = optable.count_optimizer(3, foreach)
        assert ops.optimizer(params, kind).ops == counts["ops"], f"AdamW {kind}: {REGENERATE}"


def test_issue_arithmetic_and_kernel_ops():
    a = ops.Issue(ops=10, kernel_calls=2, collectives=1)
    assert (a + a * 2).ops == 30 and (a * 2).total_ops(3.0) == 32
    assert set(ops.KERNEL_OPS) >= {"math", "torch-cpu-flash", "flash2", "flash3"}
    assert ops.KERNEL_OPS["flash2"]["forward"] == 1.0
