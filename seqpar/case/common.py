"""The rules every case keeps, whatever it measures: its world, dtype and iterations."""

from __future__ import annotations

from seqpar.algorithms.base import DTYPES
from seqpar.errors import require


def common_rules(world: int, dtype: str, warmup: int, iters: int) -> None:
    """The rules every trial keeps, whatever it measures."""
    require(isinstance(world, int) and world >= 1, "world", world, "must be a positive integer")
    require(dtype in DTYPES, "dtype", dtype, f"must be one of {', '.join(DTYPES)}")
    require(isinstance(warmup, int) and warmup >= 0, "warmup", warmup,
            "must be a non-negative integer")
    require(isinstance(iters, int) and iters >= 1, "iters", iters, "must be a positive integer")

