"""FLOP accounting of attention blocks in the ledger. The count is the rules' (`seqpar.rules.flops`:
forward 4*B*Sq*Sk*H*D, halved for a causal or shifted block, a band block counting its visible
pairs; backward BACKWARD_FLOPS times forward), booked here; a V head dim of its own (MLA) at their
mean width (`rules.flops.flop_width`)."""

from __future__ import annotations

from seqpar.algorithms import ledger
from seqpar.rules.flops import BACKWARD_FLOPS, attention_flops, band_pairs, flop_width

__all__ = ["BACKWARD_FLOPS", "attention_flops", "band_pairs", "book_flops"]


def book_flops(batch: int, sq: int, sk: int, heads: int, head_dim: int, mask: str,
               band: tuple[int, int] | None = None, *, backward: bool = False,
               v_dim: int | None = None) -> None:
    """Book one block's FLOPs (forward, or backward: BACKWARD_FLOPS x forward) in the ledger;
    v_dim: the value width where it is not head_dim."""
    factor = BACKWARD_FLOPS if backward else 1.0
    ledger.add_flops(factor * attention_flops(batch, sq, sk, heads, flop_width(head_dim, v_dim),
                                              mask, band))
