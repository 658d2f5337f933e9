"""A family's model read from its transformers checkpoint (test_families.py) trains under sequence
parallelism as in one process: ring (FSDP2 over the 2 ranks: a tied embedding sharded, the fused
head) and ulysses at P = 2 give the one-process model's loss and every gradient in float64.

The ranks import this module alone (not transformers, which only the test process needs to write
the checkpoint)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from seqpar.model import Transformer, hf
from seqpar.rules import model as rules_model


def seqpar_model(path: Path, **kwargs) -> Transformer:
    cfg = rules_model.load(str(path / "config.json"))
    net = Transformer(cfg, dtype=torch.float64, seed=1, **kwargs)
    hf.load(net, str(path))
    return net


def _sp_runs(env, path: str, tokens: torch.Tensor):
    out = []
    for attention, layout, states, mode, fused in (
            ("ring", "zigzag", "fsdp", "sc++", True),
            ("ulysses", "stripe", "replicated", "sequence", False)):
        net = seqpar_model(Path(path), attention=attention, layout=layout, group=env.group(2),
                           states=states, checkpoint=mode, fused_head=fused, head_tiles=(7, 50))
        loss = net.loss(tokens)
        loss.backward()
        out.append((attention, loss.item(), net.full_grads()))
    return out


@pytest.mark.multirank
@pytest.mark.parametrize("family", ["gemma3", "gpt-oss", "mixtral"])
def test_a_family_under_ring_and_ulysses_equals_one_process(gang, tmp_path, seed, family):
    """Gemma 3 (sliding and full layers with their own RoPE, tied head, sandwich and QK norms),
    gpt-oss (sinks, YaRN, MoE with biases) and Mixtral (MoE and its load-balancing loss over the
    whole sequence)."""
    pytest.importorskip("transformers")
    from tests.model.test_families import save_family  # the test process only

    _, tokens = save_family(family, tmp_path, seed)
    net = seqpar_model(tmp_path)
    loss = net.loss(tokens)
    loss.backward()
    want = {k: p.grad for k, p in net.named_parameters()}
    assert ("head" in want) == (family != "gemma3")  # Gemma 3 ties its head to the embedding
    for runs in gang.run(_sp_runs, str(tmp_path), tokens, size=2):
        for attention, got, grads in runs:
            assert abs(got - loss.item()) < 1e-10, (attention, got, loss.item())
            for name, g in grads.items():
                err = ((g - want[name]).abs().max() / want[name].abs().max()).item()
                assert err < 1e-8, (attention, name, err)
