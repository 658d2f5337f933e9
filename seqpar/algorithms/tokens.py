"""Gathered tokens: a rank that holds other ranks' shards (after an all-gather, an all-to-all or a
team gather) holds them in *member order*, each member's shard after the other. `GatherPlan` decides,
once per shape, whether to permute each holding into token order or keep member order, whichever
makes fewer kernel calls, and plans the calls between any two holdings:

- sorted: the holding is permuted into token order, and `layouts.block_tasks` plans the pair from the
  sorted positions (a contiguous or zigzag holding is one or two runs: a handful of calls).
- member order: the pair is every (query member, key member) pair of shards, each planned by
  `layouts.layout_tasks` (one call per pair for stripe shards, whose sorted union would be O(s)
  one-row calls).

Every rank computes the same plan from the same layout maths, so holdings that travel between ranks
(usp's context ring, WallFacer's team blocks) are read the same way everywhere. Index tensors are
cached per device, so no host-to-device copy happens per call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import torch

from seqpar.algorithms import layouts
from seqpar.algorithms.layouts import Task
from seqpar.rules.blocks import rank_positions

Holders = tuple[tuple[int, ...], ...]


def _runs(pos: torch.Tensor) -> int:
    """Contiguous runs in sorted positions."""
    if pos.numel() == 0:
        return 0
    return 1 + int((pos[1:] != pos[:-1] + 1).sum())


@dataclass
class GatherPlan:
    layout: str
    world: int
    seq_len: int
    holders: Holders
    causal: layouts.Relation | layouts.Mask | bool  # the relation or mask (bool: causal/full)
    sort: bool = False
    _tasks: dict[tuple[int, int], tuple[Task, ...]] = field(default_factory=dict, repr=False)
    _index: dict[tuple[str, int, str], torch.Tensor | None] = field(default_factory=dict,
                                                                    repr=False)

    def members(self, i: int) -> tuple[int, ...]:
        return self.holders[i]

    def rank_positions(self, r: int) -> torch.Tensor:
        """Positions of rank r's shard under this plan's relation or mask."""
        return torch.tensor(rank_positions(self.layout, r, self.world, self.seq_len, self.causal),
                            dtype=torch.long)

    def concat_positions(self, i: int) -> torch.Tensor:
        """Positions of holding i in member order."""
        return torch.cat([self.rank_positions(r) for r in self.holders[i]])

    def positions(self, i: int) -> torch.Tensor:
        """Positions of holding i in held order (sorted, or member order)."""
        pos = self.concat_positions(i)
        return torch.sort(pos).values if self.sort else pos

    def _order(self, i: int) -> torch.Tensor | None:
        return layouts.sort_order(self.concat_positions(i)) if self.sort else None

    def order(self, i: int, device: torch.device | str = "cpu") -> torch.Tensor | None:
        """Permutation from member order into held order (None: keep member order), on device."""
        key = ("order", i, str(device))
        if key not in self._index:
            order = self._order(i)
            self._index[key] = None if order is None else order.to(device)
        return self._index[key]

    def inverse(self, i: int, device: torch.device | str = "cpu") -> torch.Tensor | None:
        """Permutation from held order back into member order, on device."""
        key = ("inverse", i, str(device))
        if key not in self._index:
            order = self._order(i)
            if order is None:
                self._index[key] = None
            else:
                inv = torch.empty_like(order)
                inv[order] = torch.arange(order.numel())
                self._index[key] = inv.to(device)
        return self._index[key]

    def tasks(self, qi: int, ki: int) -> tuple[Task, ...]:
        """Kernel calls: holding qi's queries against holding ki's keys, both in held order."""
        if (qi, ki) not in self._tasks:
            if layouts.as_relation(self.causal).full:
                sq, sk = (self.concat_positions(i).numel() for i in (qi, ki))
                self._tasks[qi, ki] = (Task(0, sq, 0, sk, "full"),)
            else:
                self._tasks[qi, ki] = (self._sorted_tasks(qi, ki) if self.sort
                                       else self._member_tasks(qi, ki))
        return self._tasks[qi, ki]

    def _sorted_tasks(self, qi: int, ki: int) -> tuple[Task, ...]:
        return layouts.block_tasks(self.positions(qi), self.positions(ki), self.causal)

    def _member_tasks(self, qi: int, ki: int) -> tuple[Task, ...]:
        out: list[Task] = []
        q0 = 0
        for qr in self.holders[qi]:
            sq = self.rank_positions(qr).numel()
            k0 = 0
            for kr in self.holders[ki]:
                sk = self.rank_positions(kr).numel()
                for t in layouts.layout_tasks(self.layout, self.world, self.seq_len, qr, kr,
                                              self.causal):
                    out.append(Task(t.q0 + q0, t.q1 + q0, t.k0 + k0, t.k1 + k0, t.mask, t.band))
                k0 += sk
            q0 += sq
        return tuple(out)


@lru_cache(maxsize=512)
def gather_plan(layout: str, world: int, seq_len: int, holders: Holders,
                causal: layouts.Relation | layouts.Mask | bool) -> GatherPlan:
    """The plan for these holdings (cached per shape). Sorted or member order is chosen on the
    pair (first holding, last holding) and the diagonal pair, identically on every rank."""
    plan = GatherPlan(layout, world, seq_len, holders, causal)
    if layouts.as_relation(causal).full:
        return plan  # full attention: one call per pair in any order, so keep member order
    probe = [(0, 0), (0, len(holders) - 1)]
    member = sum(len(plan._member_tasks(a, b)) for a, b in probe)
    sorted_pos = [torch.sort(plan.concat_positions(i)).values for i in (0, len(holders) - 1)]
    estimate = sum(_runs(sorted_pos[0]) + _runs(sorted_pos[j]) for j in (0, 1))
    plan.sort = estimate < member
    return plan
