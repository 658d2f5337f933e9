"""The peers: other projects' distributed attentions, each a thin adapter around the peer's own code
(imported from its installed package, never copied), registered as `peer:<name>` algorithms, so a
sweep runs them through seqpar's harness (`plan.algorithm: peer:torch-cp-ring`).

`seqpar.algorithms.get` imports this package on the first `peer:` name it is asked for; importing it
registers every peer into `algorithms.PEERS`: its class where it can run, else the one-line reason
(`catalogue()` lists both). What a peer states without running (options, grid, rules, bytes) is its
rules class in `seqpar.rules.peers`, which the adapter subclasses and the planner reads; whether it
runs here is the adapter's `unavailable()`. docs/algorithms.md: Peers.
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
