"""The peers' rules without torch: what each `peer:<name>` algorithm (another project's attention,
run by an adapter in `seqpar.peers`) takes and states — its options, rank grid, rules, analytic
bytes, the layouts it deals, the packages it needs and how to install them — as `Rules` classes the
planner reads (`seqpar.rules.algorithms.get` answers `peer:` names from `PEERS`). Each torch adapter
subclasses its rules class (`class TorchCpRing(TorchCpRingRules, Peer)`); whether a peer can run on
this machine (its packages, CUDA) is asked of the adapter, which needs torch to know.

Bytes follow the NCCL-tests convention (the bytes that leave a rank, per destination), counted in
u = B * ceil(N/P) * D * e, the bytes of one head of one rank's shard (`AttnShape.unit`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from seqpar.errors import require
from seqpar.rules.algorithms.base import Rules
from seqpar.rules.algorithms.ring import ring_bytes
from seqpar.rules.algorithms.ulysses import seq_alltoall_bytes
from seqpar.rules.algorithms.usp import UspOptions, usp_grid
from seqpar.rules.grids import Grid
from seqpar.rules.layouts import check_layout
from seqpar.rules.options import Options, divisors, is_int
from seqpar.rules.shape import AttnShape

PREFIX = "peer:"  # a peer's name: PREFIX + its name
INSTALL = {"cpu": "pip install 'seqpar[peers]'", "gpu": "pip install 'seqpar[peers-gpu]'"}
FLOAT32 = 4  # bytes of the float32 dK,dV accumulators the flash-attn rings send


class PeerRules(Rules):
    """What every peer states: the modules it needs, how to install them, whether it runs on CUDA
    only, the layouts it deals a causal sequence in (full attention: any), and whether it splits
    K,V heads over the group as they are (no replication)."""

    modules: ClassVar[tuple[str, ...]] = ()      # import names that must be importable
    install: ClassVar[str] = INSTALL["cpu"]
    cuda_only: ClassVar[bool] = False
    layouts: ClassVar[tuple[str, ...]] = ("contiguous",)
    kv_heads_divide_world: ClassVar[bool] = False

    @classmethod
    def check(cls, shape: AttnShape, world: int, layout: str, causal: bool,
              options: Mapping[str, Any] | Options | None,
              cu_seqlens: tuple[int, ...] | None = None) -> Options:
        check_layout(layout)
        require(not causal or layout in cls.layouts, "layout", layout,
                f"{cls.name} deals a causal sequence {' or '.join(cls.layouts)} only")
        require(not cu_seqlens, "documents", cu_seqlens, f"{cls.name} takes one document per row")
        return super().check(shape, world, layout, causal, options, cu_seqlens)

    @classmethod
    def rules(cls, shape: AttnShape, world: int, options: Options) -> None:
        if cls.kv_heads_divide_world:
            require(shape.kv_heads % world == 0, "kv_heads", shape.kv_heads,
                    f"{cls.name} splits K,V heads over the group: must be divisible by {world}")
            require(shape.heads % world == 0, "heads", shape.heads,
                    f"must be divisible by the world size ({world})")


def _no_byte_model(name: str, why: str) -> NotImplementedError:
    return NotImplementedError(f"{name}: no analytic byte count is modelled ({why}); its bytes "
                               "are counted from the torch.distributed calls it makes")


# ----------------------------------------------------------------------------- yunchang Ulysses
class YunchangUlyssesRules(PeerRules):
    """yunchang splits K and V heads as they are (no replication), so heads and kv_heads must be
    divisible by P; its gathered sequence is in rank order, so a causal call needs the contiguous
    layout. Bytes: seqpar's Ulysses all-to-alls without replication — q, k, v in and out back per
    phase (dout in, dq, dk, dv back), (P-1)/P of each, gradients in the input dtype."""

    name = "peer:yunchang-ulysses"
    summary = "yunchang's UlyssesAttention: all-to-all of q, k, v, out around the kernel"
    modules = ("yunchang",)
    kv_heads_divide_world = True

    @classmethod
    def rules(cls, shape: AttnShape, world: int, options: Options) -> None:
        super().rules(shape, world, options)
        require(options.backend != "math", "backend", options.backend,
                f"{cls.name} runs yunchang's flash-attn kernel or torch's SDPA (auto, flash, torch)")

    @classmethod
    def expected_bytes(cls, shape: AttnShape, world: int, options: Options) -> dict[str, int]:
        per_phase = seq_alltoall_bytes(shape, world, world, shape.kv_heads)
        return {"forward": per_phase, "backward": per_phase}


# ----------------------------------------------------------------------------- torch's CP ring
ROTATE = ("allgather", "alltoall")


@dataclass(frozen=True)
class TorchCpOptions(Options):
    rotate: str = "allgather"  # torch's rotate method for K,V: allgather (default) | alltoall

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.rotate in ROTATE, "rotate", self.rotate, f"must be one of {', '.join(ROTATE)}")

    @classmethod
    def space(cls, world: int) -> list[Options]:
        return [cls(rotate=r) for r in ROTATE]


class TorchCpRingRules(PeerRules):
    """torch's ring deals a causal sequence zigzag (its head-tail load balancer) or contiguous and
    runs torch's SDPA kernels (backend auto or torch). Bytes, u_kv = the K and V shards: allgather
    sends (P-1) u_kv per phase, alltoall u_kv to the next rank P-1 times per phase (the same count);
    backward adds P rotations of the dK,dV accumulators in the gradient dtype (`grad_dtype`:
    'accumulate' is float32, float64 for float64 inputs) — a plain ring's bytes."""

    name = "peer:torch-cp-ring"
    summary = "torch's context-parallel ring (rotate: allgather | alltoall), head-tail = zigzag"
    Options = TorchCpOptions
    layouts = ("zigzag", "contiguous")

    @classmethod
    def rules(cls, shape: AttnShape, world: int, options: Options) -> None:
        super().rules(shape, world, options)
        require(options.backend in ("auto", "torch"), "backend", options.backend,
                f"{cls.name} runs torch's SDPA kernels (auto, torch)")

    @classmethod
    def expected_bytes(cls, shape: AttnShape, world: int, options: Options) -> dict[str, int]:
        return ring_bytes(2 * shape.kv_heads * shape.unit(world), world,
                          2 * shape.kv_heads * shape.grad_unit(world, options))


# ----------------------------------------------------------------------- ring-flash-attention
class RingFlashZigzagRules(PeerRules):
    """Causal only (its backward asserts it), on seqpar's zigzag (rank r holds chunks r and 2P-1-r
    of 2P). K,V travel P-1 hops a phase; backward the dK,dV accumulators (float32) P hops."""

    name = "peer:ring-flash-zigzag"
    summary = "ring-flash-attention's zigzag ring (flash-attn kernels, causal only)"
    modules = ("ring_flash_attn", "flash_attn")
    install = INSTALL["gpu"]
    cuda_only = True
    layouts = ("zigzag",)

    @classmethod
    def check(cls, shape: AttnShape, world: int, layout: str, causal: bool,
              options: Mapping[str, Any] | Options | None,
              cu_seqlens: tuple[int, ...] | None = None) -> Options:
        require(causal, "causal", causal, f"{cls.name} is causal only (its backward asserts it)")
        return super().check(shape, world, layout, causal, options, cu_seqlens)

    @classmethod
    def expected_bytes(cls, shape: AttnShape, world: int, options: Options) -> dict[str, int]:
        kv = 2 * shape.kv_heads * shape.unit(world)
        return ring_bytes(kv, world, kv // shape.elem_bytes * FLOAT32)


@dataclass(frozen=True)
class Llama3Options(Options):
    heads_k_stride: int | None = None  # K,V heads per all-gather (None: all at once)

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.heads_k_stride is None or (is_int(self.heads_k_stride)
                                                and self.heads_k_stride > 0),
                "heads_k_stride", self.heads_k_stride, "must be a positive integer or null")


class RingFlashLlama3Rules(PeerRules):
    """Llama 3's context parallelism on the contiguous layout: all-gather K,V (heads_k_stride heads
    at a time, which must divide kv_heads), attend, and backward all-gather K,V again and
    reduce-scatter dK,dV (input dtype): (P-1) u_kv forward, twice that backward."""

    name = "peer:ring-flash-llama3"
    summary = "ring-flash-attention's llama3 context parallelism (all-gather K,V, varlen flash)"
    Options = Llama3Options
    modules = ("ring_flash_attn", "flash_attn")
    install = INSTALL["gpu"]
    cuda_only = True

    @classmethod
    def rules(cls, shape: AttnShape, world: int, options: Options) -> None:
        super().rules(shape, world, options)
        stride = options.heads_k_stride or shape.kv_heads
        require(shape.kv_heads % stride == 0, "heads_k_stride", stride,
                f"must divide kv_heads={shape.kv_heads}")

    @classmethod
    def expected_bytes(cls, shape: AttnShape, world: int, options: Options) -> dict[str, int]:
        kv = 2 * shape.kv_heads * shape.unit(world)
        return {"forward": (world - 1) * kv, "backward": 2 * (world - 1) * kv}


# ------------------------------------------------------------------------------ yunchang USP
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
        return UspOptions(dhp=self.ulysses_degree,
                          placement="head-first" if self.use_ulysses_low else "context-first")

    @classmethod
    def space(cls, world: int) -> list[Options]:
        return [cls(ulysses_degree=d) for d in divisors(world)]


class YunchangUspRules(PeerRules):
    """USP on seqpar's usp grid (dhp = ulysses_degree, which must divide heads and kv_heads; K,V
    heads split, no replication). Its basic ring attends the gathered Ulysses-group sequence in rank
    order, so a causal call takes the contiguous layout. Bytes: the all-to-alls of q, k, v, out in
    each phase over d = ulysses_degree ranks, and a ring of r = P/d whose hop carries d shards of
    kv_heads/d heads; backward K,V again and r dK,dV accumulators (float32)."""

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

    @classmethod
    def expected_bytes(cls, shape: AttnShape, world: int, options: Options) -> dict[str, int]:
        d = options.ulysses_degree
        a2a = seq_alltoall_bytes(shape, d, world, shape.kv_heads)
        kv = 2 * shape.kv_heads * shape.unit(world)
        ring = ring_bytes(kv, world // d, kv // shape.elem_bytes * FLOAT32)
        return {phase: a2a + ring[phase] for phase in ring}


# --------------------------------------------------------------------------- TransformerEngine
COMM_TYPES = ("p2p", "all_gather", "a2a")


@dataclass(frozen=True)
class TeOptions(Options):
    comm: str = "p2p"  # TE's cp_comm_type: p2p (ring) | all_gather | a2a (Ulysses)

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.comm in COMM_TYPES, "comm", self.comm, f"must be one of {', '.join(COMM_TYPES)}")


class TransformerEngineCpRules(PeerRules):
    """A causal call wants the load-balanced dealing of 2P chunks (seqpar's zigzag); comm a2a splits
    heads and kv_heads over the ranks. No analytic byte count is modelled."""

    name = "peer:te-cp"
    summary = "TransformerEngine DotProductAttention context parallelism (comm: p2p | all_gather | a2a)"
    Options = TeOptions
    modules = ("transformer_engine",)
    install = "pip install transformer_engine[pytorch] (CUDA)"
    cuda_only = True
    layouts = ("zigzag",)

    @classmethod
    def rules(cls, shape: AttnShape, world: int, options: Options) -> None:
        if options.comm == "a2a":
            require(shape.heads % world == 0 and shape.kv_heads % world == 0, "comm", "a2a",
                    f"TE's a2a splits heads ({shape.heads}) and kv_heads ({shape.kv_heads}) over "
                    f"{world} ranks")

    @classmethod
    def expected_bytes(cls, shape: AttnShape, world: int, options: Options) -> dict[str, int]:
        raise _no_byte_model(cls.name, "TE picks its own exchanges per comm type")


# ------------------------------------------------------------------------------- MagiAttention
class MagiAttentionRules(PeerRules):
    """Any layout (it re-deals the unsharded sequence itself); head dims divisible by 8, at most
    192. No analytic byte count is modelled."""

    name = "peer:magi-attention"
    summary = "MagiAttention: dispatch solver, group collectives, flex-flash-attention kernels"
    modules = ("magi_attention",)
    install = "pip install magi-attention (CUDA, Hopper)"
    cuda_only = True
    layouts = ("contiguous", "zigzag", "stripe")

    @classmethod
    def rules(cls, shape: AttnShape, world: int, options: Options) -> None:
        require(shape.head_dim % 8 == 0 and shape.head_dim <= 192, "head_dim", shape.head_dim,
                "MagiAttention takes head dims divisible by 8, at most 192")

    @classmethod
    def expected_bytes(cls, shape: AttnShape, world: int, options: Options) -> dict[str, int]:
        raise _no_byte_model(cls.name, "its dispatch solver decides what travels")


PEERS: dict[str, type[PeerRules]] = {c.name: c for c in (
    YunchangUlyssesRules, TorchCpRingRules, RingFlashZigzagRules, RingFlashLlama3Rules,
    YunchangUspRules, TransformerEngineCpRules, MagiAttentionRules)}

__all__ = ["COMM_TYPES", "INSTALL", "PEERS", "PREFIX", "ROTATE", "Llama3Options",
           "MagiAttentionRules", "PeerRules", "RingFlashLlama3Rules", "RingFlashZigzagRules",
           "TeOptions", "TorchCpOptions", "TorchCpRingRules", "TransformerEngineCpRules",
           "YunchangUlyssesRules", "YunchangUspOptions", "YunchangUspRules"]
