"""`peer:yunchang-usp`: yunchang's `LongContextAttention` (USP: Ulysses all-to-all inside groups of
`ulysses_degree` ranks, its basic ring over the rest), with flash-attn kernels: CUDA only.

yunchang finds its two groups in a process-global singleton that `set_seq_parallel_pg` fills by
creating every group of the world. The adapter lays the same grid as seqpar's `usp` (dhp =
ulysses_degree; yunchang's `use_ulysses_low`, consecutive ranks per Ulysses group, is head-first)
and hands yunchang the mesh's groups (`PROCESS_GROUP.ULYSSES_PG`, `.RING_PG`) for each call, so no
group is created twice and several sweeps' trials do not clobber one another's.

Layout: the basic ring attends the gathered Ulysses-group sequence in rank order, so a causal call
takes the contiguous layout (yunchang's zigzag ring wants its own `zigzag_extract_local` dealing,
which is not seqpar's zigzag: not bound here). Its options, grid, rules and bytes:
`seqpar.rules.peers.YunchangUspRules`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch.distributed as dist

from seqpar.peers.adapter import AutogradPeer
from seqpar.peers.booking import P2P_HOOK, Hook, booking, equal_alltoall_sends
from seqpar.rules.peers import YunchangUspRules


@contextlib.contextmanager
def yunchang_groups(ulysses: Any, ring: Any) -> Iterator[None]:
    """yunchang's process-group singleton holding these groups for the block, restored after."""
    from yunchang.globals import PROCESS_GROUP

    saved = PROCESS_GROUP.ULYSSES_PG, PROCESS_GROUP.RING_PG
    PROCESS_GROUP.ULYSSES_PG, PROCESS_GROUP.RING_PG = ulysses, ring
    try:
        yield
    finally:
        PROCESS_GROUP.ULYSSES_PG, PROCESS_GROUP.RING_PG = saved


class YunchangUsp(YunchangUspRules, AutogradPeer):
    def groups(self) -> tuple[Any, Any]:
        return self.mesh.comm("hp").group, self.mesh.comm("cp").group

    def booking(self):
        hp, cp = self.mesh.comm("hp"), self.mesh.comm("cp")
        return booking({hp.group: hp, cp.group: cp},
                       (Hook(dist, "all_to_all_single", "all_to_all", equal_alltoall_sends),
                        P2P_HOOK))

    def run(self, q, k, v):
        from yunchang import LongContextAttention

        with yunchang_groups(*self.groups()):
            attn = LongContextAttention(ring_impl_type="basic")
            return attn(q, k, v, softmax_scale=self.scale, causal=self.causal)

    def backward(self, dout, saved, state):
        with yunchang_groups(*self.groups()):
            return super().backward(dout, saved, state)
