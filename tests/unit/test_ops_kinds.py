"""A micro-batch's issue counts each layer by its kind (`planner.host.micro_issue` on
`rules.ops`' table): a hybrid's linear layers their gated DeltaNet and LASP's exchange, not the
softmax SP algorithm's call; an MLA model's blocks MLA's; a LLaMA model's as before."""

from __future__ import annotations

import pytest

from seqpar.planner import clusters, host
from seqpar.rules import ops
from seqpar.rules.model import load

RING = {"algorithm": "ring", "d": 4, "layout": "contiguous", "options": {}, "checkpoint": "none"}


def _total(parts: list) -> ops.Issue:
    out = ops.Issue()
    for issue, _ in parts:
        out = out + issue
    return out


def _by_rule(cfg, **call) -> ops.Issue:
    """The sum the rule gives: per phase each kind's block (a softmax one's with its features),
    its SP call, the micro-batch's own."""
    soft, n_soft, n_linear = host.block_kinds(cfg)
    ((features, _),) = host.feature_groups(cfg)  # every softmax layer alike
    out = ops.Issue()
    for phase in ops.PHASES:
        block = ops.block("none", phase, kind=soft, features=features)
        out = out + ops.micro(phase) + (block + ops.attention(
            "ring", 4, layout="contiguous", phase=phase)) * n_soft
        out = out + (ops.block("none", phase, kind="linear", **call)
                     + ops.lasp("lasp2", 4, phase)) * n_linear
    return out


def test_a_hybrids_linear_layers_issue_lasp_not_the_ring():
    cfg = load("kinds-hybrid")
    assert host.block_kinds(cfg) == ("llama", 1, 3)
    got = _total(host.micro_issue(cfg, **RING, seq_len=2048))
    assert got == _by_rule(cfg, chunks=8)  # 2048 tokens over 4 ranks: 8 chunks of 64 a rank
    # LASP-2: one all-gather forward and one reduce-scatter backward a linear layer, the ring's
    # messages for the one full layer only, the halo's for the linear ones
    lasp = ops.lasp("lasp2", 4, "forward") + ops.lasp("lasp2", 4, "backward")
    ring = ops.attention("ring", 4, phase="forward") + ops.attention("ring", 4, phase="backward")
    assert lasp.collectives == 2 and got.collectives == 3 * 2 + ring.collectives
    assert got.messages == 3 * lasp.messages + ring.messages < 4 * ring.messages
    # LASP-1 passes the state by messages and gathers nothing
    one = _total(host.micro_issue(cfg, **RING, seq_len=2048, linear_sp="lasp1"))
    assert one.collectives == ring.collectives and one.messages > got.messages


def test_a_linear_layers_rule_grows_with_its_chunks_on_torch_not_under_fla():
    cfg = load("kinds-hybrid")
    per = {n: _total(host.micro_issue(cfg, **RING, seq_len=n * 4 * 64)).ops for n in (2, 4, 8)}
    assert per[8] - per[4] == 2 * (per[4] - per[2]) > 0  # linear in chunks
    fla = {n: _total(host.micro_issue(cfg, **RING, seq_len=n * 4 * 64, linear_backend="fla")).ops
           for n in (2, 8)}
    assert fla[2] == fla[8] < per[2]
    # 'auto' takes fla on a GPU, the torch rule on a CPU host
    h100 = clusters.load("h100-sxm")
    assert host.rule_backend(h100) == "fla" and host.rule_backend(h100, "torch") == "torch"


def test_an_mla_models_blocks_are_mla_blocks():
    cfg = load("kinds-mla")
    assert host.block_kinds(cfg) == ("mla", 4, 0)
    got = _total(host.micro_issue(cfg, **RING))
    assert got == _by_rule(cfg)
    llama = _total(host.micro_issue(load("kinds-gqa"), **RING))
    for phase in ops.PHASES:  # an MLA block issues more than LLaMA's
        assert ops.block(phase=phase, kind="mla").ops > ops.block(phase=phase).ops
    assert got.ops > llama.ops and got.collectives == llama.collectives


def test_a_llama_models_issue_is_the_llama_rule():
    cfg = load("kinds-gqa")
    parts = host.micro_issue(cfg, **RING)
    assert _total(parts) == _by_rule(cfg)
    assert len(parts) == 7  # block, call, micro forward; block, call, re-run forwards, micro


@pytest.mark.parametrize("mode", ["none", "full"])
def test_full_checkpointing_runs_a_linear_layers_exchange_again(mode):
    cfg = load("kinds-hybrid")
    call = {**RING, "checkpoint": mode}
    back = sum((i for i, ph in host.micro_issue(cfg, **call) if ph == "backward"), ops.Issue())
    plain = sum((i for i, ph in host.micro_issue(cfg, **RING) if ph == "backward"), ops.Issue())
    extra = back.collectives - plain.collectives
    assert extra == (3 * ops.lasp("lasp2", 4, "forward").collectives if mode == "full" else 0)
