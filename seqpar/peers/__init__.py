"""The peers: other projects' distributed attentions, each a thin adapter around the peer's own code
(imported from its installed package, never copied), registered as `peer:<name>` algorithms, so a
sweep runs them through seqpar's harness (`plan.algorithm: peer:torch-cp-ring`): float64 exactness
against the same reference, time, memory, and the bytes of the torch.distributed calls they make.

    from seqpar import peers
    peers.catalogue()       # every peer: name, what it is, and why it cannot run here (or None)

`seqpar.algorithms.get` imports this package on the first `peer:` name it is asked for; importing
it registers every peer into `algorithms.PEERS`: its class where it can run, else the one-line
reason (the package is not installed, or it needs CUDA), which a sweep reports as a ConfigError
before any actor starts. CPU peers install with `pip install 'seqpar[peers]'`.

What a peer states without running — its options, rank grid, rules, analytic bytes, layouts and the
packages it needs — is its rules class in `seqpar.rules.peers` (no torch), which the adapter here
subclasses and the planner reads (`seqpar.rules.algorithms.get("peer:...")`); whether it can run on
this machine is the adapter's `unavailable()`.
"""

from __future__ import annotations

from dataclasses import dataclass

from seqpar import algorithms
from seqpar.peers.adapter import Peer
from seqpar.peers.magi_attention import MagiAttention
from seqpar.peers.ring_flash_attn import RingFlashLlama3, RingFlashZigzag
from seqpar.peers.torch_cp_ring import TorchCpRing
from seqpar.peers.transformer_engine import TransformerEngineCp
from seqpar.peers.yunchang_ulysses import YunchangUlysses
from seqpar.peers.yunchang_usp import YunchangUsp

PEER_CLASSES: tuple[type[Peer], ...] = (
    YunchangUlysses, TorchCpRing, RingFlashZigzag, RingFlashLlama3, YunchangUsp,
    TransformerEngineCp, MagiAttention)


@dataclass(frozen=True)
class PeerInfo:
    name: str
    summary: str
    install: str
    unavailable: str | None  # why it cannot run here; None: it can


def catalogue() -> list[PeerInfo]:
    """Every peer with whether it can run on this machine."""
    return [PeerInfo(c.name, c.summary, c.install, c.unavailable()) for c in PEER_CLASSES]


def _register() -> None:
    for info, cls in zip(catalogue(), PEER_CLASSES, strict=True):
        algorithms.register_peer(info.name, cls if info.unavailable is None
                                 else f"cannot run here: {info.unavailable}")


_register()

__all__ = ["PEER_CLASSES", "Peer", "PeerInfo", "catalogue"]
