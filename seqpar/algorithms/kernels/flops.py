"""FLOP accounting of attention blocks, the papers' convention, once: forward 4*B*Sq*Sk*H*D, halved
for a causal or shifted block, a band block counting its visible pairs; backward BACKWARD_FLOPS
times forward."""

from __future__ import annotations

from seqpar.algorithms import ledger

BACKWARD_FLOPS = 2.5  # backward FLOPs / forward FLOPs of attention (the papers' convention)


def attention_flops(batch: int, sq: int, sk: int, heads: int, head_dim: int, mask: str,
                    band: tuple[int, int] | None = None) -> float:
    """Forward FLOPs of one attention block: 4*B*Sq*Sk*H*D, halved for a causal or shifted block
    (the papers' convention; backward: BACKWARD_FLOPS x that); a band block counts its visible pairs."""
    if mask == "band":
        return 4.0 * batch * band_pairs(sq, sk, band) * heads * head_dim
    full = 4.0 * batch * sq * sk * heads * head_dim
    return full if mask == "full" else full / 2


def band_pairs(sq: int, sk: int, band: tuple[int, int]) -> int:
    """Visible (i, j) pairs of a band block: 0 <= i < sq, 0 <= j < sk and band[0] <= j - i <
    band[1]. Row i sees clamp(i + b, 0, sk) - clamp(i + a, 0, sk) keys; summed in closed form
    (host integers only: no tensor work per call)."""
    def below(c: int) -> int:  # sum over rows of clamp(i + c, 0, sk): pairs with j - i < c
        return _clamp_sum(c + sq - 1, sk) - _clamp_sum(c - 1, sk)

    return max(0, below(band[1]) - below(band[0]))


def _clamp_sum(x: int, sk: int) -> int:
    """sum of clamp(t, 0, sk) over integers t <= x."""
    if x <= 0:
        return 0
    m = min(x, sk)
    return m * (m + 1) // 2 + (x - m) * sk


def book_flops(batch: int, sq: int, sk: int, heads: int, head_dim: int, mask: str,
               band: tuple[int, int] | None = None, *, backward: bool = False) -> None:
    """Book one block's FLOPs (forward, or backward: BACKWARD_FLOPS x forward) in the ledger."""
    factor = BACKWARD_FLOPS if backward else 1.0
    ledger.add_flops(factor * attention_flops(batch, sq, sk, heads, head_dim, mask, band))
