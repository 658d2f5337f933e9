"""`ulysses`, its rules: K,V head replication or ranges and the all-to-all byte counts
(DeepSpeed-Ulysses; LoongTrain §4.2 and §4.5.4)."""

from __future__ import annotations

from seqpar.rules.algorithms.base import Rules
from seqpar.rules.options import Options
from seqpar.rules.shape import AttnShape, divides


def kv_replicas(kv_heads: int, world: int) -> int:
    """How many copies of each K/V head the all-to-all needs (1 when kv_heads >= world)."""
    return 1 if kv_heads >= world else world // kv_heads


def seq_alltoall_bytes(shape: AttnShape, group: int, world: int, kv_heads: int) -> int:
    """Bytes one rank sends in one phase's all-to-alls over a head-parallel group of `group`
    ranks inside a sequence-parallel group of `world`: q, k, v (or dout) in, out (or dq, dk, dv)
    back, each (group-1)/group of its input. kv_heads counts replicated K,V heads (LoongTrain
    §4.5.4: AlltoAll_Volume = sum over q, k, v, out of Size x (dhp-1)/dhp). q and k (dq, dk) are
    head_dim wide, v and out (dv, dout) v_head_dim: each phase moves one of each per head."""
    heads_per_member = shape.heads // group + kv_heads // group
    return (group - 1) * heads_per_member * shape.kv_unit(world)


def kv_ranges(heads: int, kv_heads: int, ways: int) -> list[tuple[int, int]] | None:
    """The K,V head range [lo, hi) each of `ways` members' query heads read, or None when kv_heads
    splits (a multiple of ways) or replicates (a divisor) evenly."""
    if kv_heads % ways == 0 or ways % kv_heads == 0:
        return None
    per, group = heads // ways, heads // kv_heads
    return [(j * per // group, ((j + 1) * per - 1) // group + 1) for j in range(ways)]


def head_plan_bytes(shape: AttnShape, group: int, world: int, member: int) -> dict[str, int]:
    """Bytes member `member` of a head-parallel group sends when K,V heads go by `kv_ranges`:
    q and out (dout and dq) by all-to-all, (group-1)/group of H heads each; forward the K,V heads
    every other member reads, backward its own K,V heads' gradients to every other member."""
    ranges = kv_ranges(shape.heads, shape.kv_heads, group)
    kv = shape.kv_unit(world)  # a q head and an out head, or a K head and a V head
    qo = (group - 1) * (shape.heads // group) * kv
    widths = [hi - lo for lo, hi in ranges]
    return {"forward": qo + kv * (sum(widths) - widths[member]),
            "backward": qo + kv * (group - 1) * widths[member]}


class UlyssesRules(Rules):
    name = "ulysses"
    summary = "all-to-all sequence->heads, full attention on H/P heads"

    @classmethod
    def rules(cls, shape: AttnShape, world: int, options: Options) -> None:
        divides("heads", shape.heads, world)

    @classmethod
    def rank_bytes(cls, shape: AttnShape, world: int, options: Options,
                   rank: int) -> dict[str, int]:
        if kv_ranges(shape.heads, shape.kv_heads, world) is not None:
            return head_plan_bytes(shape, world, world, rank)
        return cls.expected_bytes(shape, world, options)

    @classmethod
    def expected_bytes(cls, shape: AttnShape, world: int, options: Options) -> dict[str, int]:
        if kv_ranges(shape.heads, shape.kv_heads, world) is not None:
            per_rank = [head_plan_bytes(shape, world, world, r) for r in range(world)]
            return {p: max(b[p] for b in per_rank) for p in ("forward", "backward")}
        kv_heads = shape.kv_heads * kv_replicas(shape.kv_heads, world)
        both = seq_alltoall_bytes(shape, world, world, kv_heads)
        return {"forward": both, "backward": both}
