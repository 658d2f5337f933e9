"""Rotary position embeddings: which frequencies a layer turns its queries and keys by.

A `Rope` is one layer kind's rotation (the base `theta`, the scaling a long-context model was
extended with, the fraction of the head dimension it turns); `inv_freq(rope, head_dim)` the
inverse frequencies and `attention_factor` the factor on cos and sin (YaRN's), as the families'
reference (Hugging Face transformers' `ROPE_INIT_FUNCTIONS`) computes them:

- default: theta^(-2i/d)
- linear: default / factor (position interpolation)
- llama3: Llama 3.1's smooth split of wavelengths at original_max / low_freq_factor and
  original_max / high_freq_factor
- yarn: YaRN's ramp between interpolated and extrapolated frequencies over the correction range of
  beta_fast..beta_slow rotations, and its attention factor (0.1 ln(factor) + 1, or DeepSeek's mscale
  ratio)

Pure Python (float64): the model builds its cos/sin tables from these, the planner needs none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from seqpar.errors import require

KINDS = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True)
class Rope:
    theta: float = 10000.0
    kind: str = "default"          # one of KINDS
    factor: float = 1.0            # context extension factor (linear, llama3, yarn)
    original_max: int = 0          # the pretraining context (llama3, yarn)
    low_freq_factor: float = 1.0   # llama3
    high_freq_factor: float = 4.0  # llama3
    beta_fast: float = 32.0        # yarn: rotations where extrapolation ends
    beta_slow: float = 1.0         # yarn: rotations where interpolation starts
    attention_factor: float = 0.0  # yarn: the factor on cos/sin (0: from factor and mscale)
    mscale: float = 0.0            # yarn (DeepSeek): numerator mscale of the attention factor
    mscale_all_dim: float = 0.0    # yarn (DeepSeek): its denominator mscale
    truncate: bool = True          # yarn: floor/ceil the correction range
    fraction: float = 1.0          # the part of head_dim that rotates (partial_rotary_factor)

    def __post_init__(self) -> None:
        require(self.kind in KINDS, "rope.kind", self.kind, f"must be one of {', '.join(KINDS)}")
        require(self.theta > 0, "rope.theta", self.theta, "must be positive")
        require(self.factor > 0, "rope.factor", self.factor, "must be positive")
        require(0 < self.fraction <= 1, "rope.fraction", self.fraction, "must be in (0, 1]")
        if self.kind in ("llama3", "yarn"):
            require(self.original_max > 0, "rope.original_max", self.original_max,
                    f"{self.kind} scaling needs original_max_position_embeddings")
        if self.kind == "llama3":
            require(self.high_freq_factor > self.low_freq_factor, "rope.high_freq_factor",
                    self.high_freq_factor, f"must exceed low_freq_factor ({self.low_freq_factor})")

    def rotary_dim(self, head_dim: int) -> int:
        """The dimensions that rotate (the first ones of each head; even)."""
        dim = int(head_dim * self.fraction)
        require(dim % 2 == 0 and dim > 0, "rope.fraction", self.fraction,
                f"must rotate an even, positive number of head_dim {head_dim}'s dimensions")
        return dim


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def attention_factor(rope: Rope) -> float:
    """The factor cos and sin are multiplied by (1 but for YaRN)."""
    if rope.kind != "yarn":
        return 1.0
    if rope.attention_factor:
        return rope.attention_factor
    if rope.mscale and rope.mscale_all_dim:
        return _yarn_mscale(rope.factor, rope.mscale) / _yarn_mscale(rope.factor, rope.mscale_all_dim)
    return _yarn_mscale(rope.factor)


def inv_freq(rope: Rope, head_dim: int) -> list[float]:
    """The rotary_dim / 2 inverse frequencies of a head of `head_dim` under `rope`."""
    dim = rope.rotary_dim(head_dim)
    base = [rope.theta ** (-i / dim) for i in range(0, dim, 2)]
    if rope.kind == "default":
        return base
    if rope.kind == "linear":
        return [f / rope.factor for f in base]
    if rope.kind == "llama3":
        return _llama3(rope, base)
    return _yarn(rope, base, dim)


def _llama3(rope: Rope, base: list[float]) -> list[float]:
    low_wavelen = rope.original_max / rope.low_freq_factor
    high_wavelen = rope.original_max / rope.high_freq_factor
    out = []
    for f in base:
        wavelen = 2 * math.pi / f
        if wavelen < high_wavelen:
            out.append(f)
        elif wavelen > low_wavelen:
            out.append(f / rope.factor)
        else:
            smooth = ((rope.original_max / wavelen - rope.low_freq_factor)
                      / (rope.high_freq_factor - rope.low_freq_factor))
            out.append((1 - smooth) * f / rope.factor + smooth * f)
    return out


def _yarn(rope: Rope, base: list[float], dim: int) -> list[float]:
    def correction_dim(rotations: float) -> float:
        return (dim * math.log(rope.original_max / (rotations * 2 * math.pi))
                / (2 * math.log(rope.theta)))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # the reference's guard against a zero-width ramp
    out = []
    for i, f in enumerate(base):
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)
        extrapolate = 1 - ramp
        out.append(f / rope.factor * (1 - extrapolate) + f * extrapolate)
    return out
