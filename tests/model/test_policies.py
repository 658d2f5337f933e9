"""Training policies for the longest sequences, and the replicated gradients' reduction.

- `tiled`: the MLP over token tiles, each recomputed in backward (ALST), gives the same loss and
  gradients as the plain block and keeps less for backward.
- `offload`: a list drawn from optimizer, params, activations; every rule a one-line error before
  anything is built (on this CPU machine each says it needs CUDA); 'activations' runs the forward
  under torch's save-on-CPU hooks.
- Replicated states reduce each gradient in place during backward: nothing the size of all the
  gradients is ever allocated, and gradients accumulate over two backwards as over one.
"""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from seqpar.errors import ConfigError
from seqpar.model import ModelConfig, Transformer
from seqpar.model.memory import AllocationMeter, TrainPolicy
from seqpar.model.states import StatePolicy

CFG = ModelConfig(vocab=61, hidden=32, layers=2, heads=4, kv_heads=2, ffn=96)


def _tokens(seed: int, n: int = 16) -> torch.Tensor:
    return torch.randint(0, CFG.vocab, (2, n + 1), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("mode", ["none", "sc++", "sequence"])
def test_a_tiled_mlp_trains_the_same_numbers_and_keeps_less(mode, seed):
    tokens = _tokens(seed, n=64)
    results = {}
    for tiled in (False, True):
        net = Transformer(CFG, checkpoint=mode, seed=3, dtype=torch.float64, tiled=tiled,
                          mlp_tile=7)
        with AllocationMeter() as mem:
            loss = net.loss(tokens)
        loss.backward()
        results[tiled] = (loss.item(), {n: p.grad for n, p in net.named_parameters()}, mem.retained)
    (plain_loss, plain_grads, plain_kept), (loss, grads, kept) = results[False], results[True]
    assert loss == pytest.approx(plain_loss, rel=1e-12)
    for name, g in grads.items():
        torch.testing.assert_close(g, plain_grads[name], rtol=1e-10, atol=1e-12)
    assert kept < plain_kept  # the ffn-wide activations of all tiles but none are gone


@pytest.mark.parametrize(("kwargs", "why"), [
    ({"offload": ("activations",)}, "needs CUDA"),
    ({"offload": ("params",)}, "needs states='fsdp'"),
    ({"offload": ("optimizer",), "states": "fsdp"}, "'optimizer' needs 'params' too"),
    ({"offload": ("params", "gradients")}, "drawn from optimizer, params, activations"),
    ({"offload": True, "states": "fsdp"}, "needs CUDA"),
])
def test_every_offload_rule_is_a_one_line_error_before_the_model_is_built(kwargs, why):
    with pytest.raises(ConfigError, match=why) as err:
        Transformer(CFG, **kwargs)
    assert str(err.value).startswith("offload=") and "\n" not in str(err.value)


def test_offload_has_one_form_everywhere():
    assert StatePolicy(offload=True).offload == ("optimizer", "params")
    assert StatePolicy(offload=False).offload == ()
    assert TrainPolicy(states="fsdp", offload=["activations", "params"]).offload == (
        StatePolicy(states="fsdp", offload=["activations", "params"]).offload) == (
        "params", "activations")
    label = TrainPolicy(states="fsdp", offload=("params",), tiled=True).label()
    assert "offload:params" in label and "tiled" in label


def test_activation_offload_runs_the_forward_under_save_on_cpu(monkeypatch):
    entered = []

    @contextlib.contextmanager
    def save_on_cpu(pin_memory=False):
        entered.append(pin_memory)
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t.clone(), lambda t: t):
            yield

    monkeypatch.setattr(torch.autograd.graph, "save_on_cpu", save_on_cpu)
    net = Transformer(CFG, seed=1)
    want = net.loss(_tokens(1)).item()
    net.policy = dataclasses.replace(net.policy, offload=("activations",))  # as on CUDA
    assert net.loss(_tokens(1)).item() == want and entered == [True]


# ------------------------------------------------------------------- replicated gradient reduction
class _Largest(TorchDispatchMode):
    """The most elements of any tensor an op makes."""

    def __init__(self):
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.numel = max(self.numel, t.numel())
        return out


def _two_backwards(env, seed):
    net = Transformer(CFG, attention="ring", layout="zigzag", group=env.group(2), seed=3,
                      dtype=torch.float64)
    net.loss(_tokens(seed)).backward()
    with _Largest() as largest:
        net.loss(_tokens(seed + 1)).backward()
    total = sum(p.numel() for p in net.parameters())
    return {n: p.grad for n, p in net.named_parameters()}, largest.numel, total


@pytest.mark.multirank
def test_replicated_gradients_reduce_in_place_and_accumulate(gang, seed):
    ref = Transformer(CFG, seed=3, dtype=torch.float64)
    ref.loss(_tokens(seed)).backward()
    ref.loss(_tokens(seed + 1)).backward()
    for grads, largest, total in gang.run(_two_backwards, seed, size=2):
        assert largest < total / 2  # no flat buffer of every gradient
        for name, p in ref.named_parameters():
            torch.testing.assert_close(grads[name], p.grad, rtol=1e-9, atol=1e-12)
