"""Training steps: P = 2 ring (zigzag, sc++, fused head) follows the one-process AdamW trajectory in
float64, every rank ends with the same parameters, and the metrics are filled in."""

from __future__ import annotations

import pytest
import torch

from seqpar.case import TrainCase
from seqpar.workers.measure.train import build, gang_train, train_steps

CASE = TrainCase(algorithm="ring", sp=2, layout="zigzag", model="tiny",
                 model_overrides=(("vocab", 61), ("hidden", 32), ("ffn", 48)), seq_len=16,
                 batch=2, dtype="float64", checkpoint="sc++", fused_head=True, head_tiles=(5, 16),
                 warmup=1, iters=3, seed=4, lr=1e-2)



def test_one_process_training_runs():
    out = train_steps(TrainCase(sp=1, algorithm="local", layout="contiguous", seq_len=32, iters=2),
                      0, None)
    assert len(out.steps) == 2 and out.summary["tgs"] > 0
    assert out.summary["activation_bytes"] > 0 and out.summary["peak_mem_bytes"] > 0
    assert "mfu" not in out.summary  # no known peak for a CPU


@pytest.mark.multirank
def test_two_ranks_follow_the_one_process_trajectory(gang):
    ranks = gang.run(gang_train, CASE, size=2)
    ref = train_steps(TrainCase(**{**CASE.__dict__, "algorithm": "local", "sp": 1,
                                   "layout": "contiguous"}), 0, None)
    for r in ranks:
        assert len(r.losses) == CASE.warmup + CASE.iters
        for a, b in zip(r.losses, ref.losses, strict=True):
            assert abs(a - b) < 1e-10, (r.losses, ref.losses)
        assert r.summary["recomputed_flops"] > 0
        assert r.ledger.total(phase="forward") > 0 and r.summary["tgs"] > 0


def test_build_uses_the_seed():
    a, b, c = (build(CASE.__class__(seed=s), None) for s in (1, 1, 2))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not any(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters(), strict=True)
                   if p.std() > 0)  # another seed, other weights (norm gains start at one)
