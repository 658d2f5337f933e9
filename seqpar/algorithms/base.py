"""What every distributed attention shares: its shape, its rules, its entry in the registry."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from seqpar.algorithms import kernels, layouts
from seqpar.algorithms.comm import Comm
from seqpar.errors import SeqparError, require

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16,
          "float16": torch.float16}


@dataclass(frozen=True)
class AttnShape:
    """The global shape of one attention call: N = seq_len tokens over the whole group."""

    batch: int
    seq_len: int
    heads: int
    kv_heads: int
    head_dim: int
    elem_bytes: int = 4

    def unit(self, world: int) -> int:
        """u = B * s * D * e: bytes of one head of one rank's shard."""
        return self.batch * (self.seq_len // world) * self.head_dim * self.elem_bytes


@dataclass(frozen=True)
class Context:
    """Everything an algorithm needs besides the tensors."""

    comm: Comm
    world: int
    rank: int
    causal: bool
    layout: str
    options: Mapping[str, Any]

    @property
    def backend(self) -> str:
        return self.options.get("backend", "auto")

    @property
    def scale(self) -> float | None:
        return self.options.get("scale")


Rule = Callable[[AttnShape, int, Mapping[str, Any]], None]
Bytes = Callable[[AttnShape, int, Mapping[str, Any]], dict[str, int]]
RankBytes = Callable[[AttnShape, int, Mapping[str, Any], int], dict[str, int]]
Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Context], torch.Tensor]

COMMON_OPTIONS: dict[str, Any] = {"backend": "auto", "scale": None}


@dataclass(frozen=True)
class AlgorithmSpec:
    """An algorithm: how to run it, which options it takes, its rules and its analytic bytes."""

    name: str
    summary: str
    run: Forward
    rules: Rule
    expected_bytes: Bytes
    options: Mapping[str, Any] = field(default_factory=dict)
    setup: Callable[[Context], None] | None = None  # collective set-up (sub-groups), all ranks
    rank_bytes: RankBytes | None = None  # one rank's bytes, when ranks send different amounts

    def resolve_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        allowed = {**COMMON_OPTIONS, **self.options}
        for key in options:
            require(key in allowed, "option", key,
                    f"{self.name} takes {', '.join(sorted(allowed))}")
        resolved = {**allowed, **options}
        scale = resolved["scale"]
        require(scale is None or (isinstance(scale, int | float) and scale > 0), "scale", scale,
                "must be a positive number (default 1/sqrt(head_dim))")
        require(resolved["backend"] in kernels.BACKENDS, "backend", resolved["backend"],
                f"must be one of {', '.join(kernels.BACKENDS)}")
        return resolved

    def bytes_of_rank(self, shape: AttnShape, world: int, options: Mapping[str, Any],
                      rank: int) -> dict[str, int]:
        """Analytic bytes `rank` sends per call, by phase (expected_bytes is the most any rank sends)."""
        resolved = self.resolve_options(options)
        if self.rank_bytes is None:
            return self.expected_bytes(shape, world, resolved)
        return self.rank_bytes(shape, world, resolved, rank)

    def check(self, shape: AttnShape, world: int, layout: str, causal: bool,
              options: Mapping[str, Any]) -> None:
        """Every rule for this configuration; raises ConfigError naming field, value and rule."""
        check_shape(shape)
        layouts.check_seq_len(layout, world, shape.seq_len)
        self.rules(shape, world, self.resolve_options(options))


def check_shape(shape: AttnShape) -> None:
    for name in ("batch", "seq_len", "heads", "kv_heads", "head_dim"):
        value = getattr(shape, name)
        require(isinstance(value, int) and value > 0, name, value, "must be a positive integer")
    require(shape.heads % shape.kv_heads == 0, "kv_heads", shape.kv_heads,
            f"must divide heads={shape.heads}")


def divides(field_name: str, value: int, world: int, what: str = "the world size") -> None:
    require(value % world == 0, field_name, value, f"must be divisible by {what} ({world})")


def shape_of(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, world: int) -> AttnShape:
    """Validate local shards (batch, seq, heads, head_dim) and return the global shape."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        require(t.dim() == 4, f"{name}.shape", tuple(t.shape),
                "must be (batch, seq, heads, head_dim)")
    require(k.shape == v.shape, "v.shape", tuple(v.shape), f"must equal k.shape {tuple(k.shape)}")
    require(q.shape[0] == k.shape[0] and q.shape[1] == k.shape[1] and q.shape[3] == k.shape[3],
            "k.shape", tuple(k.shape),
            f"must match q.shape {tuple(q.shape)} in batch, seq and head_dim")
    require(q.dtype == k.dtype == v.dtype, "k.dtype", str(k.dtype),
            f"q, k and v must share one dtype (q is {q.dtype})")
    require(q.dtype in DTYPES.values(), "q.dtype", str(q.dtype),
            f"must be one of {', '.join(DTYPES)}")
    return AttnShape(q.shape[0], q.shape[1] * world, q.shape[2], k.shape[2], q.shape[3],
                     q.element_size())


class Attention:
    """A built distributed attention: call it on local shards q, k, v (bshd) -> local out."""

    def __init__(self, spec: AlgorithmSpec, ctx: Context):
        self.spec, self.ctx = spec, ctx

    @property
    def name(self) -> str:
        return self.spec.name

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        shape = shape_of(q, k, v, self.ctx.world)
        self.spec.check(shape, self.ctx.world, self.ctx.layout, self.ctx.causal, self.ctx.options)
        kernels.resolve_backend(self.ctx.backend, q.device, q.dtype)
        return self.spec.run(q, k, v, self.ctx)

    def expected_bytes(self, shape: AttnShape) -> dict[str, int]:
        return self.spec.expected_bytes(shape, self.ctx.world, self.ctx.options)

    def __repr__(self) -> str:
        opts = {k: v for k, v in self.ctx.options.items() if v != COMMON_OPTIONS.get(k, object())}
        return (f"Attention({self.name}, world={self.ctx.world}, layout={self.ctx.layout}, "
                f"causal={self.ctx.causal}, options={opts})")


def group_context(group: dist.ProcessGroup | None, causal: bool, layout: str,
                  options: Mapping[str, Any]) -> Context:
    """The context of one rank in `group` (the world group by default; a group of one when
    torch.distributed is not initialised)."""
    if group is not None and not (dist.is_available() and dist.is_initialized()):
        raise SeqparError("group: torch.distributed is not initialised; "
                          "call init_process_group first or pass no group at world size 1")
    comm = Comm(group, label="sp")
    return Context(comm, comm.size, comm.rank, causal, layout, options)
