"""BurstEngine's sequence-level selective checkpointing (`seq-attn`, §3.2) on the decoder: exact in
float64 against the one-process model, its recompute re-running the distributed attention for the
prefix alone (the ledger books the prefix's ring as a forward during backward, its FLOPs are F² of a
causal forward's), and refused in one line where a rank's first F of its tokens is not a global
prefix or the attention keeps more than q, k, v, out and lse."""

from __future__ import annotations

import pytest
import torch

from seqpar import algorithms
from seqpar.algorithms import recording
from seqpar.errors import ConfigError
from seqpar.model import Transformer
from seqpar.rules.memory import check_seq_attn, prefix_layout
from seqpar.rules.shape import AttnShape
from tests.model.test_exactness import CONFIGS, TILES, N, check, reference, tokens_for

WORLD = 4
# (algorithm, layout, fraction, heads, fused, documents): each layout seq-attn takes, both
# algorithms, a fraction below 1/2, packed documents over stripe (the packed row's prefix)
RUNS = (("ring", "stripe", 0.25, "mha", False, None),
        ("burst", "stripe", 0.5, "gqa", True, None),
        ("ring", "zigzag", 0.5, "gqa", False, None),
        ("burst", "stripe", 0.75, "mha", False, (0, 5, 12, N)))


def _runs(env, seed: int):
    out = []
    for algorithm, layout, fraction, kind, fused, cu in RUNS:
        options = {"ranks_per_node": 2} if algorithm == "burst" else {}
        net = Transformer(CONFIGS[kind], attention=algorithm, layout=layout,
                          group=env.group(WORLD), checkpoint="seq-attn", seq_fraction=fraction,
                          fused_head=fused, seed=3, dtype=torch.float64, head_tiles=TILES,
                          **options)
        with recording() as ledger:
            loss = net.loss(tokens_for(seed), cu_seqlens=cu)
            forward = ledger.total(phase="forward")
            flops_before = ledger.flops["forward"]
            loss.backward()
        # the prefix's attention on its own, as a plain call of the same algorithm: what the
        # recompute must have run (each layer once)
        cfg, m = CONFIGS[kind], round(fraction * N / WORLD)
        alone = algorithms.build_attention(algorithm, layout=prefix_layout(layout, WORLD, fraction),
                                           group=env.group(WORLD), **options)
        q, k, v = (torch.randn(2, m, h, cfg.head_dim, dtype=torch.float64)
                   for h in (cfg.heads, cfg.kv_heads, cfg.kv_heads))
        with recording() as one:
            alone(q, k, v, cu_seqlens=None if cu is None else _clipped(cu, m * WORLD))
        out.append((loss.item(), net.full_grads(), ledger.total(phase="forward") - forward,
                    ledger.flops["forward"] - flops_before, cfg.layers * one.total(),
                    cfg.layers * one.flops["forward"]))
    return out


def _clipped(cu: tuple[int, ...], n: int) -> tuple[int, ...]:
    return tuple(c for c in cu if c < n) + (n,)


@pytest.mark.multirank
def test_seq_attn_matches_one_process_and_recomputes_the_prefix_only(gang, seed):
    per_rank = gang.run(_runs, seed, size=WORLD)
    for i, (algorithm, layout, fraction, kind, fused, cu) in enumerate(RUNS):
        if cu is None:
            want = reference(kind, fused, seed)
        else:  # the one-process model on the same packed documents
            net = Transformer(CONFIGS[kind], fused_head=fused, seed=3, dtype=torch.float64,
                              head_tiles=TILES)
            loss = net.loss(tokens_for(seed), cu_seqlens=cu)
            loss.backward()
            want = (loss.item(), {n: p.grad for n, p in net.named_parameters()})
        for rank, results in enumerate(per_rank):
            loss, grads, replay, recomputed, ring, ring_flops = results[i]
            check(f"seq-attn {algorithm} {layout} F={fraction} docs={cu} rank {rank}",
                  (loss, grads), want)
            # backward re-ran the prefix's distributed attention, every layer, and nothing else
            assert (replay, recomputed) == (ring, ring_flops) and 0 < replay, (rank, replay, ring)
        if cu is None:  # the prefix's ring carries the prefix's K,V: its analytic forward bytes
            cfg, m = CONFIGS[kind], round(fraction * N / WORLD)
            prefix = AttnShape(2, m * WORLD, cfg.heads, cfg.kv_heads, cfg.head_dim, 8)
            options = {"ranks_per_node": 2} if algorithm == "burst" else {}
            bytes_ = algorithms.expected_bytes(algorithm, prefix, WORLD, **options)["forward"]
            assert per_rank[0][i][2] == cfg.layers * bytes_


@pytest.mark.parametrize(("args", "field", "words"), [
    (("ring", "contiguous", 0.5, 4, 64), "layout", "stripe"),
    (("ring", "zigzag", 0.25, 4, 64), "layout", "seq_fraction 0.5"),
    (("usp", "stripe", 0.5, 4, 64), "checkpoint", "ring, burst, local"),
    (("ring", "balanced", 0.5, 4, 64), "layout", "stripe"),
])
def test_seq_attn_refuses_what_holds_no_global_prefix_in_one_line(args, field, words):
    with pytest.raises(ConfigError) as err:
        check_seq_attn(*args)
    assert str(err.value).startswith(f"{field}=") and words in str(err.value)
    assert "\n" not in str(err.value)


def test_seq_attn_refuses_zigzag_documents_and_a_full_mask():
    with pytest.raises(ConfigError, match="one document"):
        check_seq_attn("ring", "zigzag", 0.5, 4, 64, documents=True)
    with pytest.raises(ConfigError, match="later key"):
        check_seq_attn("ring", "stripe", 0.5, 4, 64, causal=False)
    check_seq_attn("burst", "stripe", 0.3, 4, 64, documents=True)  # the packed row's prefix
    check_seq_attn("local", "contiguous", 0.3, 1, 64)  # one rank: any layout
