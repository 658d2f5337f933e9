"""Documents and windows as relations in `layouts.block_tasks`, the 'band' kernel mask, and the
per-document zigzag."""

from __future__ import annotations

import pytest
import torch

from seqpar.algorithms import kernels, layouts
from seqpar.errors import ConfigError


def _dense(q_pos, k_pos, causal, cu, window):
    """The relation from its definition (document ids, distances)."""
    doc = torch.zeros(100, dtype=torch.long)
    for i, (a, b) in enumerate(zip(cu or (0, 100), (cu or (0, 100))[1:], strict=False)):
        doc[a:b] = i
    keep = doc[q_pos][:, None] == doc[k_pos][None, :]
    d = q_pos[:, None] - k_pos[None, :]
    if causal:
        keep &= d >= 0
    if window:
        keep &= d.abs() < window
    return keep.long()


def _from_tasks(tasks, sq, sk):
    mask = torch.zeros(sq, sk, dtype=torch.long)
    for t in tasks:
        i = torch.arange(t.q1 - t.q0)[:, None]
        j = torch.arange(t.k1 - t.k0)[None, :]
        block = {"full": (i >= 0) & (j >= 0), "causal": j <= i, "shifted": j < i}.get(t.mask)
        if t.mask == "band":
            block = (j - i >= t.band[0]) & (j - i < t.band[1])
        mask[t.q0:t.q1, t.k0:t.k1] += block.long()
    return mask


@pytest.mark.parametrize("trial", range(300))
def test_block_tasks_cover_documents_and_windows_exactly_once(trial):
    g = torch.Generator().manual_seed(trial)
    sq, sk = (int(torch.randint(1, 30, (1,), generator=g)) for _ in range(2))
    q_pos = torch.randperm(100, generator=g)[:sq].sort().values
    k_pos = q_pos.clone() if trial % 3 == 0 else torch.randperm(100, generator=g)[:sk].sort().values
    docs = int(torch.randint(0, 5, (1,), generator=g))
    cu = (tuple(sorted({0, 100, *torch.randint(1, 100, (docs,), generator=g).tolist()}))
          if docs else None)
    causal, window = bool(trial % 2), (None, 1, 2, 7, 30)[trial % 5]
    tasks = layouts.block_tasks(q_pos, k_pos, layouts.Relation(causal, cu, window))
    assert torch.equal(_from_tasks(tasks, sq, len(k_pos)),
                       _dense(q_pos, k_pos, causal, cu, window))


def test_a_window_block_is_one_band_call_and_unseen_blocks_get_none():
    pos = torch.arange(16)
    rel = layouts.Relation(True, None, 3)
    tasks = layouts.block_tasks(pos, pos, rel)
    assert [t.mask for t in tasks] == ["causal", "band"]  # rows 0..2 causal, then one band
    assert layouts.block_tasks(pos + 100, pos, rel) == ()  # beyond the window: no call
    two_docs = layouts.Relation(True, (0, 16, 32), None)
    assert layouts.block_tasks(pos + 16, pos, two_docs) == ()  # another document: no call


@pytest.mark.parametrize("backend", ["torch", "math"])
@pytest.mark.parametrize("band", [(0, 1), (0, 3), (0, 40), (-2, 1)])
def test_band_kernel_matches_masked_reference(backend, band):
    g = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(2, n, 4, 8, generator=g, dtype=torch.float64)
                     for n in (9, 12, 12, 9))
    k, v = k[:, :, :2], v[:, :, :2]
    keep = kernels.band_keep(9, 12, band, "cpu")
    rows = keep.any(1)
    out, lse = kernels.attend(q, k, v, "band", band=band, backend=backend)
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(
        qr.transpose(1, 2), kr.transpose(1, 2), vr.transpose(1, 2),
        attn_mask=keep | ~rows[:, None], enable_gqa=True).transpose(1, 2)
    torch.testing.assert_close(out[:, rows], ref[:, rows], rtol=1e-12, atol=1e-12)
    (ref[:, rows] * dout[:, rows]).sum().backward()
    dout = dout * rows[None, :, None, None]
    dq, dk, dv = kernels.attend_backward(dout, q, k, v, out, lse, "band", band=band,
                                         backend=backend)
    for got, want in ((dq[:, rows], qr.grad[:, rows]), (dk, kr.grad), (dv, vr.grad)):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    assert kernels.attention_flops(1, 9, 12, 1, 1, "band", band) == 4 * int(keep.sum())


def test_zigzag_deals_each_document_in_2p_chunks():
    cu = (0, 8, 24)
    assert layouts.positions("zigzag", 0, 2, 24, cu).tolist() == [0, 1, 6, 7, 8, 9, 10, 11,
                                                                  20, 21, 22, 23]
    x = torch.randn(1, 24, 1, 1)
    shards = [layouts.shard(x, "zigzag", r, 2, cu_seqlens=cu) for r in range(2)]
    assert torch.equal(layouts.unshard(shards, "zigzag", cu_seqlens=cu), x)
    assert layouts.positions("stripe", 1, 2, 24, cu).tolist() == list(range(1, 24, 2))


def test_bad_documents_are_config_errors():
    with pytest.raises(ConfigError, match="cu_seqlens.*increase strictly"):
        layouts.positions("contiguous", 0, 2, 24, (0, 8, 8, 24))
    with pytest.raises(ConfigError, match="seq_len=30.*any length with cu_seqlens"):
        layouts.positions("zigzag", 0, 4, 30)


@pytest.mark.parametrize("layout", layouts.LAYOUTS)
@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_any_length_and_any_documents_deal_floor_or_ceil_tokens_sorted(layout, world):
    g = torch.Generator().manual_seed(world)
    for _ in range(20):
        n = int(torch.randint(world, 90, (1,), generator=g))
        cut = torch.randint(1, n, (int(torch.randint(0, 6, (1,), generator=g)),), generator=g)
        cu = tuple(sorted({0, n, *cut.tolist()}))
        pos = [layouts.positions(layout, r, world, n, cu) for r in range(world)]
        assert sorted(torch.cat(pos).tolist()) == list(range(n))
        assert {len(p) for p in pos} <= {n // world, -(-n // world)}
        assert all(bool((p[1:] > p[:-1]).all()) for p in pos)
        s = -(-n // world)  # padded: the real tokens, then padding positions >= N
        padded = layouts.positions(layout, 1, world, s * world, cu)
        assert padded[:len(pos[1])].tolist() == pos[1].tolist() and len(padded) == s
        assert bool((padded[len(pos[1]):] >= n).all())


@pytest.mark.parametrize("world", [4, 8])
def test_per_document_zigzag_balances_causal_work_of_documents_spanning_16x(world):
    """8 documents of 1..16 units (benchmarks/document_balance.py): per-document zigzag keeps
    max/mean visible pairs per rank <= 1.1; the per-sequence zigzag does not. Lengths 8P*u+3 (not
    multiples of 2P: the tails go round robin) stay within the target too."""
    units = (6, 1, 16, 3, 8, 2, 12, 4)
    for extra in (0, 3):
        cu = [0]
        for u in units:
            cu.append(cu[-1] + u * 8 * world + extra)
        assert _imbalance(tuple(cu), world, True) <= 1.1
        if extra == 0:
            assert _imbalance(tuple(cu), world, True) == 1.0
            assert _imbalance(tuple(cu), world, False) > 1.15


def _imbalance(cu: tuple[int, ...], world: int, per_document: bool) -> float:
    """max/mean visible pairs per rank, zigzag dealt per document or per sequence."""
    n, rel = cu[-1], layouts.Relation(True, cu, None)
    work = [rel.pairs(layouts.positions("zigzag", r, world, n, cu if per_document else None),
                      torch.arange(n)) for r in range(world)]
    return max(work) / (sum(work) / world)
