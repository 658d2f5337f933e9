"""Band blocks (a sliding window's block, a document's lower edge): through a window on the
FlashAttention-2 kernels (flash-attn, torch's flash kernel); elsewhere (aten's CPU flash kernel,
the math kernel) under an explicit mask, as row tiles when the band is much narrower than its
block."""

from __future__ import annotations

import torch

from seqpar.algorithms.kernels.aten import aten_backward, aten_forward
from seqpar.algorithms.kernels.capability import window_kernel
from seqpar.algorithms.kernels.engines import WINDOW_FORWARD
from seqpar.algorithms.kernels.flash import flash_window
from seqpar.algorithms.kernels.math_kernel import math_backward, math_forward
from seqpar.algorithms.kernels.tensors import acc_dtype, seq_rows


def band_keep(sq: int, sk: int, band: tuple[int, int], device) -> torch.Tensor:
    """The band's boolean mask (True: visible), (Sq, Sk)."""
    d = (torch.arange(sk, device=device).unsqueeze(0)
         - torch.arange(sq, device=device).unsqueeze(1))
    return (d >= band[0]) & (d < band[1])


# Without flash-attn a band runs under an explicit mask, over the whole (Sq, Sk) rectangle. A band
# much narrower than its block therefore runs as row tiles of BAND_TILE rows, each against only the
# keys its rows see (Sq x (BAND_TILE + width) pairs instead of Sq x Sk): a window of N/8 over a
# whole sequence costs about a quarter of the full rectangle, not all of it.
BAND_TILE = 256


def band_tiles(sq: int, sk: int, band: tuple[int, int]
               ) -> list[tuple[int, int, int, int, tuple[int, int]]]:
    """(r0, r1, c0, c1, tile band) for the row tiles [r0, r1) of a band block, each against keys
    [c0, c1) (c1 <= c0: its rows see nothing) and the band relative to the tile. One tile, the block
    as it is, unless tiling computes under three quarters of the rectangle."""
    width = band[1] - band[0]
    if sq <= BAND_TILE or 4 * (BAND_TILE + width) >= 3 * sk:
        return [(0, sq, 0, sk, band)]
    tiles = []
    for r0 in range(0, sq, BAND_TILE):
        r1 = min(r0 + BAND_TILE, sq)
        c0, c1 = max(0, r0 + band[0]), min(sk, r1 - 1 + band[1])
        tiles.append((r0, r1, c0, c1, (band[0] + r0 - c0, band[1] + r0 - c0)))
    return tiles


def band_forward(q, k, v, band, kernel, scale):
    """A band block: through a window on a FlashAttention-2 kernel, else under an explicit mask
    (row tiles where the band is narrow)."""
    sq, sk = q.shape[1], k.shape[1]
    windowed = window_kernel(kernel, q.device, q.dtype, q.shape[-1])
    if windowed is not None:
        return WINDOW_FORWARD[windowed](q, k, v, False, scale, window=flash_window(sq, sk, band))
    tiles = band_tiles(sq, sk, band)
    if len(tiles) == 1:
        return band_dense_forward(q, k, v, band, kernel, scale)
    outs, lses = [], []
    for r0, r1, c0, c1, tile_band in tiles:
        rows = seq_rows(q, r0, r1)
        if c1 <= c0:
            outs.append(rows.new_zeros(*rows.shape[:3], v.shape[-1]))
            lses.append(torch.full((q.shape[0], q.shape[2], r1 - r0), float("-inf"),
                                   dtype=acc_dtype(q.dtype), device=q.device))
            continue
        o, lse = band_dense_forward(rows, seq_rows(k, c0, c1), seq_rows(v, c0, c1), tile_band,
                                     kernel, scale)
        outs.append(o)
        lses.append(lse.to(acc_dtype(q.dtype)))
    return torch.cat(outs, dim=1), torch.cat(lses, dim=2)


def band_dense_forward(q, k, v, band, kernel, scale):
    sq, sk = q.shape[1], k.shape[1]
    keep = band_keep(sq, sk, band, q.device)
    if kernel == "torch-cpu-flash":
        return aten_forward(q, k, v, False, scale, keep)
    return math_forward(q, k, v, False, scale, keep)


def band_dense_backward(dout, q, k, v, out, lse, band, kernel, scale):
    keep = band_keep(q.shape[1], k.shape[1], band, q.device)
    if kernel == "torch-cpu-flash":
        return aten_backward(dout, q, k, v, out, lse, False, scale, keep)
    return math_backward(dout, q, k, v, out, lse, False, scale, keep)


def band_tiled_backward(dout, q, k, v, out, lse, tiles, kernel, scale):
    """Gradients of a band run as `band_tiles`: dq tile by tile, dk and dv summed over the tiles
    whose keys overlap, in the accumulation dtype."""
    work = acc_dtype(q.dtype)
    dqs = []
    dk = torch.zeros(k.shape, dtype=work, device=k.device)
    dv = torch.zeros(v.shape, dtype=work, device=v.device)
    for r0, r1, c0, c1, tile_band in tiles:
        if c1 <= c0:
            dqs.append(torch.zeros_like(seq_rows(q, r0, r1)))
            continue
        gq, gk, gv = band_dense_backward(
            seq_rows(dout, r0, r1), seq_rows(q, r0, r1), seq_rows(k, c0, c1), seq_rows(v, c0, c1),
            seq_rows(out, r0, r1), lse.narrow(2, r0, r1 - r0), tile_band, kernel, scale)
        dqs.append(gq)
        seq_rows(dk, c0, c1).add_(gk)
        seq_rows(dv, c0, c1).add_(gv)
    return torch.cat(dqs, dim=1), dk.to(k.dtype), dv.to(v.dtype)
