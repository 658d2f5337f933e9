"""The shape of one attention call and the units its byte counts are written in, no torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from seqpar.errors import require
from seqpar.rules.layouts import shard_len

PHASES = ("forward", "backward")
DTYPE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}
# the relative error (max |error| / max |float64 reference|) a result in each dtype is held to
TOLERANCE = {"float64": 1e-10, "float32": 2e-5, "bfloat16": 3e-2, "float16": 5e-3}

# Shapes of one attention layer, by name. `tiny` is what 2 CPU cores finish in seconds; the others are
# the papers' models (LoongTrain and WallFacer use 7B shapes; llama3-8b is the GQA case, H/Hkv = 4).
SHAPE_PRESETS: dict[str, dict[str, int]] = {
    "tiny": {"heads": 8, "kv_heads": 8, "head_dim": 32},
    "tiny-gqa": {"heads": 8, "kv_heads": 2, "head_dim": 32},
    "llama2-7b": {"heads": 32, "kv_heads": 32, "head_dim": 128},
    "llama3-8b": {"heads": 32, "kv_heads": 8, "head_dim": 128},
    "llama3-70b": {"heads": 64, "kv_heads": 8, "head_dim": 128},
}


@dataclass(frozen=True)
class AttnShape:
    """The global shape of one attention call: N = seq_len tokens over the whole group. head_dim
    is the query/key width; v_head_dim the value (and output) width where it differs (MLA: 192 and
    128), None where it is head_dim."""

    batch: int
    seq_len: int
    heads: int
    kv_heads: int
    head_dim: int
    elem_bytes: int = 4
    v_head_dim: int | None = None

    @property
    def v_dim(self) -> int:
        """The value (and output) head width."""
        return self.head_dim if self.v_head_dim is None else self.v_head_dim

    @classmethod
    def of_model(cls, cfg: Any, batch: int, seq_len: int, elem_bytes: int) -> AttnShape:
        """One softmax attention layer of a decoder (`rules.model.ModelConfig`): multi-head latent
        attention's K,V have every query head (rebuilt from the latent) and V its own width."""
        kv_heads = cfg.heads if cfg.mla else cfg.kv_heads
        v = None if cfg.v_head_dim in (0, cfg.head_dim) else cfg.v_head_dim
        return cls(batch, seq_len, cfg.heads, kv_heads, cfg.head_dim, elem_bytes, v)

    def shard_len(self, world: int) -> int:
        """s: rows of every rank's shard as it travels, ceil(N / P) (uneven shards are padded)."""
        return shard_len(self.seq_len, world)

    def unit(self, world: int) -> int:
        """u = B * s * D * e: bytes of one query (or key) head of one rank's shard."""
        return self.batch * self.shard_len(world) * self.head_dim * self.elem_bytes

    def v_unit(self, world: int) -> int:
        """B * s * D_v * e: bytes of one value (or output) head of one rank's shard."""
        return self.batch * self.shard_len(world) * self.v_dim * self.elem_bytes

    def kv_unit(self, world: int) -> int:
        """Bytes of one K head and one V head of one rank's shard: 2u where the widths agree."""
        return self.unit(world) + self.v_unit(world)

    @property
    def acc_bytes(self) -> int:
        """Bytes of one element in the accumulation dtype (float64 for float64, else float32)."""
        return 8 if self.elem_bytes == 8 else 4

    def grad_bytes(self, options: Any) -> int:
        """Bytes of one element of a gradient message that is summed where it arrives."""
        return self.acc_bytes if options.grad_dtype == "accumulate" else self.elem_bytes

    def grad_unit(self, world: int, options: Any) -> int:
        """u for gradient messages: B * s * D * (bytes of the gradient dtype)."""
        return self.unit(world) // self.elem_bytes * self.grad_bytes(options)

    def v_grad_unit(self, world: int, options: Any) -> int:
        """`v_unit` for gradient messages: B * s * D_v * (bytes of the gradient dtype)."""
        return self.v_unit(world) // self.elem_bytes * self.grad_bytes(options)

    def kv_grad_unit(self, world: int, options: Any) -> int:
        """`kv_unit` for gradient messages (one dK head and one dV head)."""
        return self.grad_unit(world, options) + self.v_grad_unit(world, options)


def check_shape(shape: AttnShape) -> None:
    for name in ("batch", "seq_len", "heads", "kv_heads", "head_dim"):
        value = getattr(shape, name)
        require(isinstance(value, int) and value > 0, name, value, "must be a positive integer")
    v = shape.v_head_dim
    require(v is None or (isinstance(v, int) and v > 0), "v_head_dim", v,
            "must be a positive integer (or None: head_dim)")
    require(shape.heads % shape.kv_heads == 0, "kv_heads", shape.kv_heads,
            f"must divide heads={shape.heads}")


def divides(field_name: str, value: int, world: int, what: str = "the world size") -> None:
    require(value % world == 0, field_name, value, f"must be divisible by {what} ({world})")
