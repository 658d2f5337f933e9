"""Autograd runs a CUDA backward on its own device thread, where the forward's context is unset.

Under `checkpoint="full"` the backward replays the distributed attention's forward; its
communication must still land in the ledger that recorded the step. Reproduced on the CPU by running
`backward()` in a fresh thread.
"""

from __future__ import annotations

import threading

import pytest
import torch

from seqpar.algorithms import recording
from seqpar.model import ModelConfig, Transformer

CFG = ModelConfig(vocab=61, hidden=32, layers=2, heads=4, kv_heads=2, ffn=48)


def _replayed_bytes(env, algorithm: str, seed: int):
    net = Transformer(CFG, attention=algorithm, layout="zigzag", group=env.group(2),
                      checkpoint="full", seed=3, dtype=torch.float64)
    tokens = torch.randint(0, CFG.vocab, (2, 17), generator=torch.Generator().manual_seed(seed))
    with recording() as ledger:
        loss = net.loss(tokens)
        forward = ledger.total(phase="forward")
        worker = threading.Thread(target=loss.backward)
        worker.start()
        worker.join()
    return forward, ledger.total(phase="forward"), ledger.total(phase="backward")


@pytest.mark.multirank
@pytest.mark.parametrize("algorithm", ("ring", "ulysses"))
def test_full_checkpoint_replay_is_booked_from_another_thread(gang, algorithm, seed):
    for forward, after, backward in gang.run(_replayed_bytes, algorithm, seed, size=2):
        assert forward > 0 and backward > 0
        assert after == 2 * forward, "the replayed forward's bytes were not booked"
