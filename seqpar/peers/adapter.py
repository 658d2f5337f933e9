"""What every peer adapter shares: whether the peer can run here, the booking of its bytes
(booking.py), and the bridge from its own autograd to seqpar's forward/backward pair.

A peer is an `Algorithm` (so the harness builds, times, meters and checks it like seqpar's own) whose
forward and backward call the peer's code, imported from its installed package. What it states
without running (its options, rules, bytes, layouts, the packages it needs) is its rules class in
`seqpar.rules.peers`, which each adapter subclasses first: `class TorchCpRing(TorchCpRingRules, Peer)`.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Sequence
from typing import Any

import torch

from seqpar.algorithms import kernels
from seqpar.algorithms.base import Algorithm
from seqpar.algorithms.comm import SubComm
from seqpar.errors import require
from seqpar.peers.booking import Hook, booking
from seqpar.rules.peers import PeerRules


class Peer(PeerRules, Algorithm):
    """An adapter around another project's attention: its rules (`PeerRules`: the modules it needs,
    whether it runs on CUDA only, the layouts it deals), whether it can run here, and its
    communication hooks."""

    @classmethod
    def unavailable(cls) -> str | None:
        """Why this peer cannot run on this machine (None: it can)."""
        reasons = []
        if cls.cuda_only and not torch.cuda.is_available():
            reasons.append("runs on CUDA GPUs only and this torch sees none")
        missing = [m for m in cls.modules if importlib.util.find_spec(m.split(".")[0]) is None]
        if missing:
            reasons.append(f"needs {', '.join(missing)}, not installed ({cls.install})")
        return "; ".join(reasons) or None

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        require(self.window is None, "window", self.window, f"{self.name} takes no window")
        group = self.comm.group
        require(self.world == 1 or (not isinstance(self.comm, SubComm) and group is not None),
                "algorithm", self.name, "a peer needs a process group of its own (build the "
                "attention on the whole world or pass mesh=)")

    def booking(self) -> contextlib.AbstractContextManager[None]:
        """Book the peer's calls on this rank's sequence-parallel group (see `booking`)."""
        return booking({self.comm.group: self.comm}, self.hooks())

    def hooks(self) -> Sequence[Hook]:
        return ()

    def book_share(self, q: torch.Tensor, factor: float) -> None:
        """Book this rank's FLOPs under the current phase as the call's total over P (factor 1:
        forward, 2.5: backward): a peer does not report the blocks it computes."""
        b, s, h, d = q.shape
        n = s * self.world
        kernels.book_flops(b, n, n, h, d, "causal" if self.causal else "full", factor / self.world)


class AutogradPeer(Peer):
    """A peer whose code is differentiable torch (autograd Functions and modules): forward runs it
    on fresh leaves and keeps its graph; backward runs that graph's backward."""

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, q, k, v):
        grads = any(t.requires_grad for t in (q, k, v))  # a forward-only call keeps no graph
        leaves = tuple(t.detach().requires_grad_(grads) for t in (q, k, v))
        self.book_share(q, 1.0)
        with torch.set_grad_enabled(grads), self.booking():
            out = self.run(*leaves)
        return out.detach(), (), (out, leaves)

    def backward(self, dout, saved, state):
        out, leaves = state
        self.book_share(leaves[0], 2.5)
        with self.booking():
            return torch.autograd.grad(out, leaves, dout)
