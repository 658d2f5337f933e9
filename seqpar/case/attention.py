"""`Case`: one attention experiment on one process group (modes fwd, fwd+bwd, accuracy), its
shape, mask and documents, and every rule it keeps (`validate`)."""

from __future__ import annotations

from dataclasses import dataclass

from seqpar import algorithms
from seqpar.algorithms import layouts
from seqpar.algorithms.base import DTYPES, AttnShape
from seqpar.algorithms.layouts import call_cu
from seqpar.case.common import common_rules
from seqpar.errors import require
from seqpar.rules import masks

MODES = ("fwd", "fwd+bwd", "accuracy")  # accuracy: errors against float64 (workers/measure/accuracy.py)


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
    mask: str = ""                     # any mask, its compact form (masks.SPECS; "": causal/full)

    def __post_init__(self) -> None:  # any length: uneven shards carry N as one document [0, N]
        if self.world > 0 and not self.mask:
            cu = call_cu(self.world, self.seq_len, self.cu_seqlens) or ()
            object.__setattr__(self, "cu_seqlens", cu)

    @property
    def shape(self) -> AttnShape:
        return AttnShape(self.batch, self.seq_len, self.heads, self.kv_heads, self.head_dim,
                         DTYPES[self.dtype].itemsize)

    @property
    def option_dict(self) -> dict[str, object]:
        return dict(self.options)

    @property
    def attention_mask(self) -> masks.Mask | None:
        """The mask this case's queries see (None: causal/full with its documents and window)."""
        return masks.parse(self.mask, self.seq_len) if self.mask else None

    def label(self) -> str:
        opts = "".join(f" {k}={v}" for k, v in self.options)
        mask = self.mask[:40] if self.mask else "causal" if self.causal else "full"
        if self.cu_seqlens:
            mask += f" docs={len(self.cu_seqlens) - 1}"
        if self.window is not None:
            mask += f" W={self.window}"
        return (f"{self.algorithm}{opts} P={self.world} {self.layout} {mask} N={self.seq_len} "
                f"H={self.heads}/{self.kv_heads} {self.dtype}")

    def validate(self) -> None:
        """Every rule of this case, before any actor starts (raises ConfigError): the trial's own
        (world, mode, dtype, iterations, window, documents) and the algorithm's
        (`seqpar.algorithms.check`). With documents (cu_seqlens) any length runs: the layout's
        seq_len rule relaxes (uneven shards are padded)."""
        common_rules(self.world, self.dtype, self.warmup, self.iters)
        require(self.mode in MODES, "mode", self.mode, f"must be one of {', '.join(MODES)}")
        require(self.window is None or (isinstance(self.window, int) and self.window > 0),
                "window", self.window, "must be a positive integer (or None: no window)")
        if self.mask:
            require(not self.cu_seqlens and self.window is None, "mask", self.mask,
                    "takes the place of cu_seqlens and window (give documents and windows as "
                    "mask kinds)")
            m = self.attention_mask
            cu = layouts.call_cu(self.world, self.seq_len, m.cu)
            cu = None if cu is None else layouts.normal_cu(self.layout, self.world, self.seq_len, cu)
            algorithms.get(self.algorithm).check(self.shape, self.world, self.layout, self.causal,
                                                 self.option_dict, cu)
            return
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
