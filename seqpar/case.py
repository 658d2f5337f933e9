"""One attention experiment on one process group, as plain data: what a rank needs to run it.

The pydantic ExperimentSpec (experiments/spec.py) validates user input and becomes a Case; the
check, the benchmark and the Ray rank workers (workers/) all run Cases. It lives at the top of the
package, beside the errors, so that both layers use it without either importing the other.
"""

from __future__ import annotations

from dataclasses import dataclass

from seqpar.algorithms.base import DTYPES, AttnShape
from seqpar.algorithms.layouts import call_cu
from seqpar.errors import require

MODES = ("fwd", "fwd+bwd", "accuracy")  # accuracy: errors against float64 (workers/accuracy.py)


@dataclass(frozen=True)
class Case:
    algorithm: str
    world: int
    layout: str = "zigzag"
    causal: bool = True
    batch: int = 2
    seq_len: int = 48          # tokens in the whole sequence (all ranks together)
    heads: int = 4
    kv_heads: int = 4
    head_dim: int = 8
    dtype: str = "float64"
    seed: int = 0
    options: tuple[tuple[str, object], ...] = ()  # algorithm options, sorted (key, value) pairs
    mode: str = "fwd+bwd"
    warmup: int = 1
    iters: int = 3
    cu_seqlens: tuple[int, ...] = ()  # global document boundaries [0, ..., N]; () = one document
    window: int | None = None          # sliding window (None: none)

    def __post_init__(self) -> None:  # any length: uneven shards carry N as one document [0, N]
        if self.world > 0:
            cu = call_cu(self.world, self.seq_len, self.cu_seqlens) or ()
            object.__setattr__(self, "cu_seqlens", cu)

    @property
    def shape(self) -> AttnShape:
        return AttnShape(self.batch, self.seq_len, self.heads, self.kv_heads, self.head_dim,
                         DTYPES[self.dtype].itemsize)

    @property
    def option_dict(self) -> dict[str, object]:
        return dict(self.options)

    def label(self) -> str:
        opts = "".join(f" {k}={v}" for k, v in self.options)
        mask = "causal" if self.causal else "full"
        if self.cu_seqlens:
            mask += f" docs={len(self.cu_seqlens) - 1}"
        if self.window is not None:
            mask += f" W={self.window}"
        return (f"{self.algorithm}{opts} P={self.world} {self.layout} {mask} N={self.seq_len} "
                f"H={self.heads}/{self.kv_heads} {self.dtype}")

    def check(self) -> None:
        """Every rule of the algorithm for this case (`seqpar.algorithms.check`, one place for the
        rules). With documents (cu_seqlens) any length runs: the layout's seq_len rule relaxes (uneven
        shards are padded)."""
        from seqpar import algorithms
        from seqpar.algorithms import layouts

        require(self.window is None or (isinstance(self.window, int) and self.window > 0),
                "window", self.window, "must be a positive integer (or None: no window)")
        if not self.cu_seqlens:
            algorithms.check(self.algorithm, self.shape, self.world, self.layout, self.causal,
                             **self.option_dict)
            return
        require(self.cu_seqlens[-1] == self.seq_len, "cu_seqlens", list(self.cu_seqlens),
                f"must end at seq_len={self.seq_len}")
        cls = algorithms.get(self.algorithm)
        layouts.check_layout(self.layout)
        cu = layouts.normal_cu(self.layout, self.world, self.seq_len, self.cu_seqlens)
        cls.check(self.shape, self.world, self.layout, self.causal, self.option_dict, cu)
