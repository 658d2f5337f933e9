"""`burst` (BurstAttention, BurstEngine §3.1), its rules: the topology-aware ring's grid, packed query
messages (every segment at a 16-byte boundary) and the query ring's bytes (Alg. 2), net of what the
routes skip."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from seqpar.errors import require
from seqpar.rules import groups, route
from seqpar.rules.algorithms.base import Geometry
from seqpar.rules.algorithms.ring import RingRules, ring_bytes
from seqpar.rules.grids import Grid
from seqpar.rules.options import Options, is_int
from seqpar.rules.shape import AttnShape

ALIGN = 16  # bytes: every segment of a packed message starts at a multiple of this


def aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def packed_size(segment_bytes: Sequence[int]) -> int:
    """Bytes of a packed message whose segments have these sizes (each padded to ALIGN)."""
    return sum(aligned(n) for n in segment_bytes)


def query_ring_bytes(q_bytes: int, dq_bytes: int, world: int) -> int:
    """Backward bytes one rank sends on a query ring of `world`: the block P - 1 times, dq P times."""
    return 0 if world == 1 else (world - 1) * q_bytes + world * dq_bytes


def skipped_query_ring_bytes(q_bytes: int, dq_bytes: int, plan: route.Plan) -> int:
    """Bytes of `query_ring_bytes` a position does not send on its route (`plan`)."""
    return ((plan.full_kv_messages - plan.kv_messages) * q_bytes
            + (plan.full_grad_messages - plan.grad_messages) * dq_bytes)


def query_block_bytes(shape: AttnShape, world: int, tokens_factor: int = 1,
                      options: Options | None = None) -> tuple[int, int]:
    """(query block message, dq message) bytes for a block of tokens_factor shards: D and lse in
    the accumulation dtype, q (head_dim wide) and dO (v_head_dim) in the input dtype, packed; dq in
    the gradient dtype."""
    options = options or Options()
    u, uv = shape.unit(world) * tokens_factor, shape.v_unit(world) * tokens_factor
    stats = shape.batch * shape.shard_len(world) * tokens_factor * shape.heads * shape.acc_bytes
    block = packed_size([stats, stats, shape.heads * u, shape.heads * uv])
    return block, shape.heads * shape.grad_unit(world, options) * tokens_factor

@dataclass(frozen=True)
class BurstOptions(Options):
    ranks_per_node: int | None = None  # nodes are blocks of this many ranks (default: the mesh's)

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.ranks_per_node is None or (is_int(self.ranks_per_node)
                                                and self.ranks_per_node >= 1),
                "ranks_per_node", self.ranks_per_node,
                "must be a positive integer (or None: the trial's topology)")


class BurstRules(RingRules):
    name = "burst"
    summary = ("topology-aware ring (intra-node sub-rings + inter-node step); backward moves "
               "Q, dO, D, lse and dQ, K,V stay home")
    Options = BurstOptions
    axes = ("inner", "outer")

    @classmethod
    def grid(cls, world: int, options: Options, nodes: Sequence[int] | None = None) -> Grid:
        if options.ranks_per_node is not None:
            nodes = [r // options.ranks_per_node for r in range(world)]
        per_node = groups.node_block_size(nodes if nodes is not None else [0] * world)
        if per_node == world:
            return Grid.line(world)
        return Grid((("outer", world // per_node), ("inner", per_node)))

    @classmethod
    def expected_bytes(cls, shape: AttnShape, world: int, options: Options) -> dict[str, int]:
        block, dq = query_block_bytes(shape, world, options=options)
        forward = ring_bytes(shape.kv_heads * shape.kv_unit(world), world)["forward"]
        return {"forward": forward, "backward": query_ring_bytes(block, dq, world)}

    @classmethod
    def latent_bytes(cls, shape, world, options, rank, width, geometry=None):
        """The forward ring carries MLA's latent; backward's query ring is burst's own (K,V stay
        home, rebuilt once from the rank's own latent)."""
        forward = super().latent_bytes(shape, world, options, rank, width, geometry)["forward"]
        return {"forward": forward,
                "backward": cls.bytes_of_rank(shape, world, options, rank, geometry)["backward"]}

    @classmethod
    def ring_inner(cls, world: int, options: Options) -> int:
        """The inner ring of the grid without a topology: ranks_per_node, else the flat ring (a
        mesh's own node map, which the class cannot see, may cut it otherwise)."""
        dims = dict(cls.grid(world, options).dims)
        return dims.get("inner", world)

    @classmethod
    def skipped_bytes(cls, shape: AttnShape, world: int, options: Options, rank: int,
                      mask: Geometry) -> dict[str, int]:
        if not options.skips(mask.relation) or world == 1:
            return dict.fromkeys(("forward", "backward"), 0)
        inner, need = cls.ring_inner(world, options), mask.need(world)
        forward = route.plan(world, inner, rank, need)
        backward = route.plan(world, inner, rank, route.transpose(need))
        block, dq = query_block_bytes(shape, world, options=options)
        kv = shape.kv_heads * shape.kv_unit(world)
        return {"forward": (forward.full_kv_messages - forward.kv_messages) * kv,
                "backward": skipped_query_ring_bytes(block, dq, backward)}
