"""Bytes each checkpointing mode keeps for backward per block, measured from the allocator events,
equal the analytic count exactly (full: x; sc++: x + out + lse; sequence(f): attention state + x +
(1 - f) of the rest; seq-attn(f): x + out and lse of the tokens after the prefix); and every mode
gives the same loss and gradients in one process."""

from __future__ import annotations

import pytest
import torch

from seqpar.errors import ConfigError
from seqpar.model import CHECKPOINT_MODES, ModelConfig, Transformer
from seqpar.model.checkpointing import SEQ_ATTN
from seqpar.model.measure import checkpoint_bytes

CFG = ModelConfig(vocab=53, hidden=32, layers=2, heads=4, kv_heads=2, ffn=48)


@pytest.mark.parametrize("fraction", (0.25, pytest.param(0.5, marks=pytest.mark.slow)))
def test_bytes_per_block_match_the_analytic_count(fraction):
    rows = {r["mode"]: r for r in checkpoint_bytes(CFG, batch=2, seq_len=32, fraction=fraction,
                                                   repeats=1)}
    for mode, r in rows.items():
        assert r["measured"] == r["analytic"], (mode, r)
    x = 2 * 32 * CFG.hidden * 8
    assert rows["full"]["measured"] == x
    assert rows["sc++"]["measured"] == 2 * x + 2 * 32 * CFG.heads * 8  # x + out + lse
    assert (rows["full"]["measured"] < rows["sc++"]["measured"] < rows["sc++,sequence"]["measured"]
            < rows["sequence"]["measured"] < rows["none"]["measured"])
    # BurstEngine Table 2's order: between full and sc++, by the kept tokens' out and lse
    assert rows["full"]["measured"] < rows[SEQ_ATTN]["measured"] < rows["sc++"]["measured"]
    assert rows[SEQ_ATTN]["measured"] - x == (1 - fraction) * (rows["sc++"]["measured"] - x)


def test_every_mode_gives_the_same_loss_and_gradients():
    tokens = torch.randint(0, CFG.vocab, (2, 25), generator=torch.Generator().manual_seed(5))
    results = []
    for mode in (*CHECKPOINT_MODES, SEQ_ATTN):
        net = Transformer(CFG, checkpoint=mode, seq_fraction=0.4, dtype=torch.float64)
        loss = net.loss(tokens)
        loss.backward()
        results.append((loss.item(), [p.grad for p in net.parameters()]))
    for loss, grads in results[1:]:
        assert abs(loss - results[0][0]) < 1e-12
        for g, g0 in zip(grads, results[0][1], strict=True):
            assert torch.allclose(g, g0, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("kwargs", "field"), [({"checkpoint": "selective"}, "checkpoint"),
                                               ({"seq_fraction": 1.5}, "seq_fraction"),
                                               ({"head_tiles": (0, 8)}, "head_tiles")])
def test_bad_options_name_their_field(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        Transformer(CFG, **kwargs)
