"""The planner's memory description of a training step equals what the runner holds: model states
(`state_bytes`) and the activations a forward keeps (`AllocationMeter`), one process, every
checkpoint mode, fused or not, the MLP tiled or not, and with master weights wider than the compute
dtype (their casts are kept for backward where the weights are not recomputed)."""

from __future__ import annotations

import gc

import pytest
import torch

from seqpar.model import CHECKPOINT_MODES, ModelConfig, Transformer
from seqpar.model.memory import (
    AllocationMeter,
    AttentionHeld,
    TrainPolicy,
    predicted_activations,
    predicted_states,
    state_breakdown,
)
from tests.resources import FULL

CFG = ModelConfig(vocab=128, hidden=64, layers=2, heads=4, kv_heads=2, ffn=96)
N = 64


VARIANTS = ((None, False), ("float64", False), (None, True))  # (master dtype, tiled)


def _cases() -> list[tuple[str, bool, str | None, bool]]:
    """Every checkpoint mode x fused head x variant under SEQPAR_TEST_FULL; else each mode once,
    the head alternating and the variant cycling (every variant meets both heads)."""
    return [(mode, fused, *VARIANTS[v]) for i, mode in enumerate((*CHECKPOINT_MODES, "seq-attn"))
            for j, fused in enumerate((False, True)) for v in range(len(VARIANTS))
            if FULL or (j == i % 2 and v == i % len(VARIANTS))]


def test_the_cases_meet_every_mode_head_and_variant():
    cases = _cases()
    assert {c[0] for c in cases} == {*CHECKPOINT_MODES, "seq-attn"}
    assert {(c[1], *c[2:]) for c in cases} == {(f, *v) for f in (False, True) for v in VARIANTS}


@pytest.mark.parametrize(("mode", "fused", "master", "tiled"), _cases())
def test_predicted_step_memory_is_what_one_process_holds(mode, fused, master, tiled):
    dtypes = {None: None, "float64": torch.float64}
    net = Transformer(CFG, checkpoint=mode, fused_head=fused, head_tiles=(16, 32),
                      dtype=torch.float32, master_dtype=dtypes[master], tiled=tiled, mlp_tile=16)
    opt = torch.optim.AdamW(net.parameters())
    tokens = torch.randint(0, CFG.vocab, (1, N + 1), generator=torch.Generator().manual_seed(1))
    net.loss(tokens).backward()
    opt.step()
    held = state_breakdown(net, opt)
    opt.zero_grad(set_to_none=True)
    retained = []
    for _ in range(2):  # the least of two: a first call may allocate lazily initialised state
        gc.collect()
        with AllocationMeter() as mem:
            loss = net.loss(tokens)
        del loss
        retained.append(mem.retained)
    policy = TrainPolicy(checkpoint=mode, fused_head=fused, master_dtype=master, tiled=tiled)
    want = predicted_states(CFG, "float32", policy, 1)
    assert (want["params"], want["grads"]) == (held["params"], held["grads"])
    steps = 4 * len(list(net.parameters()))  # AdamW's step counter per parameter (fp32 scalars)
    assert held["optimizer"] - want["optimizer"] == steps
    d = CFG.hidden
    attn = AttentionHeld(saved=d + 2 * CFG.kv_heads * CFG.head_dim,
                         recomputable=d + 2 * CFG.kv_heads * CFG.head_dim)
    predicted = predicted_activations(CFG, 1, N, "float32", policy, attn)
    assert predicted == pytest.approx(min(retained), rel=0.02), (retained, held)
