"""What a micro-batch of sequences costs on a group of d ranks (`CostModel`): the prediction every
deal is made by, and the planner times a deal with (`planner.lengths.deal_cost` fills it in).

A micro-batch's cost on d ranks: its attention (attention x visible pairs of each sequence / d:
the sum of L² over documents, not the square of the pack; a short sequence's calls at the kernel's
lower rate with `half`), its SP communication (comm x tokens x (d - 1) / d, or the planner's rate
per group size `comm_at`; hidden under the attention with `overlap`), linear x tokens / d and the
host's issue of a micro-batch on d ranks, `fixed_of(d)` (added to the device's time on a CPU,
overlapping it on a GPU: `host_overlaps`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property


@dataclass(frozen=True)
class CostModel:
    """Predicted seconds of sequences on d ranks (see the module docstring)."""

    attention: float = 1.0     # seconds per visible (query, key) pair, forward + backward
    linear: float = 0.0        # seconds per token: GEMMs, element-wise, the head
    comm: float = 0.0          # seconds per token of SP communication, times (d - 1) / d
    window: int | None = None  # a causal sliding window inside each sequence (None: causal)
    comm_at: tuple[tuple[int, float], ...] = ()  # (d, seconds per token) in place of comm's
    overlap: bool = False      # the communication runs under the attention (a ring's)
    half: float = 0.0          # a call's query tokens (n / d) at which the kernel runs at half rate
    fixed: float = 0.0         # seconds a micro-batch costs whatever it holds (the host's issue)
    fixed_at: tuple[tuple[int, float], ...] = ()  # (d, seconds) in place of fixed's on d ranks
    host_overlaps: bool = False  # the host issues while the device runs (a GPU): a micro-batch
    #                              lasts the longer of the two, not their sum

    def pairs(self, n: int) -> int:
        """Visible pairs of one causal sequence of n tokens (under the window, if any)."""
        w = self.window
        if w is None or w >= n:
            return n * (n + 1) // 2
        return w * (w + 1) // 2 + (n - w) * w

    @cached_property
    def _comm_at(self) -> dict[int, float]:
        return dict(self.comm_at)

    def comm_of(self, d: int) -> float:
        """Seconds per token of a group of d's SP communication."""
        if d == 1:
            return 0.0
        got = self._comm_at.get(d)
        return self.comm * (d - 1) / d if got is None else got

    def attention_s(self, n: int, d: int) -> float:
        """One sequence's attention seconds on each of d ranks."""
        return self.attention * self.pairs(n) * (1.0 + self.half * d / n) / d

    @cached_property
    def _fixed_at(self) -> dict[int, float]:
        return dict(self.fixed_at)

    def fixed_of(self, d: int) -> float:
        """Seconds the host spends issuing a micro-batch on d ranks, whatever it holds."""
        return self._fixed_at.get(d, self.fixed)

    def device(self, attn: float, tokens: int, d: int) -> float:
        """The device's seconds of a micro-batch of `tokens` tokens on d ranks whose attention
        takes `attn` (the host's issue apart)."""
        comm = self.comm_of(d) * tokens
        return (max(attn, comm) if self.overlap else attn + comm) + self.linear * tokens / d

    def of(self, attn: float, tokens: int, d: int) -> float:
        """Seconds of a micro-batch of `tokens` tokens on d ranks whose attention takes `attn`."""
        device, host = self.device(attn, tokens, d), self.fixed_of(d)
        return max(device, host) if self.host_overlaps else device + host

    def seconds(self, lengths: Sequence[int], d: int) -> float:
        return self.of(sum(self.attention_s(n, d) for n in lengths), sum(lengths), d)

    def each(self, lengths: Sequence[int], sizes: Sequence[int]) -> tuple[list[float], list[float]]:
        """(attention seconds, seconds alone) of each sequence on its group size (memoised by
        length and size: a step's lengths repeat)."""
        seen: dict[tuple[int, int], tuple[float, float]] = {}
        att, one = [], []
        for n, d in zip(lengths, sizes, strict=True):
            got = seen.get((n, d))
            if got is None:
                a = self.attention_s(n, d)
                got = seen[(n, d)] = (a, self.of(a, n, d))
            att.append(got[0])
            one.append(got[1])
        return att, one

    def floor(self, attn: float, tokens: int, d: int, packs: int = 0) -> float:
        """Rank-seconds that sequences of `tokens` tokens and attention `attn` on d ranks cost
        however they are packed into at least `packs` micro-batches (a lower bound: the overlap
        does not add up; the host's issue adds, or bounds it where it overlaps the device's)."""
        device, host = d * self.device(attn, tokens, d), packs * d * self.fixed_of(d)
        return max(device, host) if self.host_overlaps else device + host
