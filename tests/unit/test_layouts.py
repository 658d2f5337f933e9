from __future__ import annotations

import pytest
import torch

from seqpar.algorithms import layouts
from seqpar.errors import ConfigError


@pytest.mark.parametrize("layout", layouts.LAYOUTS)
@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
def test_shard_then_unshard_restores_the_sequence(layout, world):
    x = torch.randn(2, 48, 3, 5)
    shards = [layouts.shard(x, layout, r, world) for r in range(world)]
    assert all(s.shape[1] == 48 // world for s in shards)
    torch.testing.assert_close(layouts.unshard(shards, layout), x, rtol=0, atol=0)


@pytest.mark.parametrize("layout", layouts.LAYOUTS)
def test_positions_partition_the_sequence_and_are_sorted(layout):
    pos = [layouts.positions(layout, r, 4, 32) for r in range(4)]
    assert sorted(torch.cat(pos).tolist()) == list(range(32))
    assert all(bool((p[1:] > p[:-1]).all()) for p in pos)


def test_zigzag_gives_rank_r_chunks_r_and_2p_minus_1_minus_r():
    assert layouts.positions("zigzag", 1, 4, 16).tolist() == [2, 3, 12, 13]
    assert layouts.positions("stripe", 1, 4, 8).tolist() == [1, 5]


def test_a_plain_length_must_split_over_the_ranks_not_the_layouts_pieces():
    with pytest.raises(ConfigError, match="seq_len=30.*multiple of world=4"):
        layouts.check_seq_len("zigzag", 4, 30)
    layouts.check_seq_len("zigzag", 4, 36)  # 36 = 4 x 9: not 8 zigzag chunks, still one rule
    for rank in range(4):  # dealt as the one document [0, 36] is
        assert layouts.positions("zigzag", rank, 4, 36).tolist() == \
            layouts.positions("zigzag", rank, 4, 36, (0, 36)).tolist()
    with pytest.raises(ConfigError, match="layout='diagonal'"):
        layouts.check_layout("diagonal")


def _mask_from_tasks(tasks, sq, sk):
    mask = torch.zeros(sq, sk, dtype=torch.int64)
    for t in tasks:
        n, m = t.q1 - t.q0, t.k1 - t.k0
        block = {"full": torch.ones(n, m, dtype=torch.int64),
                 "causal": torch.ones(n, m, dtype=torch.int64).tril(),
                 "shifted": torch.ones(n, m, dtype=torch.int64).tril(-1)}[t.mask]
        mask[t.q0:t.q1, t.k0:t.k1] += block
    return mask


@pytest.mark.parametrize("trial", range(30))
def test_block_tasks_cover_the_causal_mask_exactly_once(trial):
    g = torch.Generator().manual_seed(trial)
    sq, sk = (int(torch.randint(1, 20, (1,), generator=g)) for _ in range(2))
    q_pos = torch.randperm(60, generator=g)[:sq].sort().values
    k_pos = torch.randperm(60, generator=g)[:sk].sort().values
    tasks = layouts.block_tasks(q_pos, k_pos)
    want = (q_pos[:, None] >= k_pos[None, :]).long()
    assert torch.equal(_mask_from_tasks(tasks, sq, sk), want)


@pytest.mark.parametrize("layout", layouts.LAYOUTS)
def test_layout_blocks_cover_the_causal_mask_between_every_rank_pair(layout):
    world, n = 4, 32
    for i in range(world):
        for j in range(world):
            qp, kp = layouts.positions(layout, i, world, n), layouts.positions(layout, j, world, n)
            tasks = layouts.layout_tasks(layout, world, n, i, j, True)
            assert torch.equal(_mask_from_tasks(tasks, len(qp), len(kp)),
                               (qp[:, None] >= kp[None, :]).long())
            # every classic layout needs one kernel call per block; balanced at most two per
            # pair of its chunks
            most = 1 if layout != "balanced" else 2 * layouts.balanced_chunks(world, n) ** 2
            assert len(tasks) <= most


def test_stripe_blocks_are_causal_on_and_below_the_diagonal_and_shifted_above():
    assert layouts.layout_tasks("stripe", 4, 32, 2, 1, True)[0].mask == "causal"
    assert layouts.layout_tasks("stripe", 4, 32, 1, 2, True)[0].mask == "shifted"
