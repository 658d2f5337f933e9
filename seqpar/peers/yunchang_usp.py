"""`peer:yunchang-usp`: yunchang's `LongContextAttention` (USP: Ulysses all-to-all inside groups of
`ulysses_degree` ranks, its basic ring over the rest), with flash-attn kernels: CUDA only.

yunchang finds its two groups in a process-global singleton that `set_seq_parallel_pg` fills by
creating every group of the world. The adapter lays the same grid as seqpar's `usp` (dhp =
ulysses_degree; yunchang's `use_ulysses_low`, consecutive ranks per Ulysses group, is head-first)
and hands yunchang the mesh's groups (`PROCESS_GROUP.ULYSSES_PG`, `.RING_PG`) for each call, so no
group is created twice and several sweeps' trials do not clobber one another's.

Layout: the basic ring attends the gathered Ulysses-group sequence in rank order, so a causal call
takes the contiguous layout (yunchang's zigzag ring wants its own `zigzag_extract_local` dealing,
which is not seqpar's zigzag: not bound here).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from seqpar.algorithms.base import AttnShape
from seqpar.algorithms.mesh import Grid
from seqpar.algorithms.usp import UspOptions, usp_grid
from seqpar.errors import require
from seqpar.peers.adapter import INSTALL, AutogradPeer
from seqpar.peers.booking import P2P_HOOK, Hook, booking, equal_alltoall_sends
from seqpar.rules.options import Options, divisors, is_int

PLACEMENTS = {True: "head-first", False: "context-first"}


@dataclass(frozen=True)
class YunchangUspOptions(Options):
    ulysses_degree: int = 1      # ranks per Ulysses (all-to-all) group; the ring has P / it
    use_ulysses_low: bool = True  # Ulysses groups of consecutive ranks (seqpar's head-first)

    def __post_init__(self) -> None:
        super().__post_init__()
        require(is_int(self.ulysses_degree) and self.ulysses_degree >= 1, "ulysses_degree",
                self.ulysses_degree, "must be a positive integer")

    def check(self, world: int) -> None:
        require(world % self.ulysses_degree == 0, "ulysses_degree", self.ulysses_degree,
                f"must divide the world size ({world})")

    def usp(self) -> UspOptions:
        """The same grid as seqpar's usp options."""
        return UspOptions(dhp=self.ulysses_degree, placement=PLACEMENTS[self.use_ulysses_low])

    @classmethod
    def space(cls, world: int) -> list[Options]:
        return [cls(ulysses_degree=d) for d in divisors(world)]


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


class YunchangUsp(AutogradPeer):
    name = "peer:yunchang-usp"
    summary = "yunchang's LongContextAttention (USP: Ulysses groups x basic flash ring)"
    Options = YunchangUspOptions
    axes = ("hp", "cp", "inner", "outer")
    modules = ("yunchang", "flash_attn")
    install = INSTALL["gpu"]
    cuda_only = True

    @classmethod
    def grid(cls, world: int, options: Options, nodes: Sequence[int] | None = None) -> Grid:
        return usp_grid(world, options.usp())

    @classmethod
    def rules(cls, shape: AttnShape, world: int, options: Options) -> None:
        d = options.ulysses_degree
        require(shape.heads % d == 0 and shape.kv_heads % d == 0, "ulysses_degree", d,
                f"must divide heads ({shape.heads}) and kv_heads ({shape.kv_heads})")

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

    @classmethod
    def expected_bytes(cls, shape: AttnShape, world: int, options: Options) -> dict[str, int]:
        d, r = options.ulysses_degree, world // options.ulysses_degree
        u = shape.unit(world)
        a2a = (d - 1) * 2 * (shape.heads + shape.kv_heads) // d * u
        kv = 2 * shape.kv_heads * u  # a ring hop carries d shards of kv_heads / d heads
        dkv = kv // shape.elem_bytes * 4  # dK,dV accumulators travel in float32
        ring_bwd = (r - 1) * kv + r * dkv if r > 1 else 0
        return {"forward": a2a + (r - 1) * kv, "backward": a2a + ring_bwd}
