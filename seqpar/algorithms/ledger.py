"""The communication ledger: every byte an algorithm sends, and the attention work it does.

Bytes follow the NCCL-tests convention (bytes that must leave a rank): p2p send = tensor bytes;
all-gather = (G-1) x shard; reduce-scatter and all-to-all = (G-1)/G x input. A collective's bytes are
split by peer, so a group that spans nodes books its intra- and inter-node shares separately.

Messages a schedule skips because no query of the ranks they would reach sees their block
(`route`, option `skip_transfers`) are booked apart, in `skipped`, by the same keys (the op, group
and link of the message the unskipped schedule sends): `total()` is what was sent, `total() +
skipped_total()` what the unskipped schedule sends.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field

from seqpar.rules.shape import PHASES

LINKS = ("intra", "inter")

def link_class(rank_a: int, rank_b: int,
               node_of_rank: Sequence[int] | Mapping[int, int] | None = None) -> str:
    """'intra' when both global ranks sit on one node by `node_of_rank` (None: one node)."""
    if node_of_rank is None or node_of_rank[rank_a] == node_of_rank[rank_b]:
        return "intra"
    return "inter"


_phase: contextvars.ContextVar[str] = contextvars.ContextVar("seqpar_phase", default="forward")
_ledgers: contextvars.ContextVar[tuple[Ledger, ...]] = contextvars.ContextVar(
    "seqpar_ledgers", default=()
)


@dataclass
class Entry:
    op: str
    group: str
    link: str
    phase: str
    bytes_sent: int = 0
    calls: int = 0


@dataclass
class Ledger:
    """Bytes by (op, group, link, phase) and attention FLOPs by phase, for one rank."""

    node_of_rank: Sequence[int] | None = None
    entries: dict[tuple[str, str, str, str], Entry] = field(default_factory=dict)
    flops: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    skipped: dict[tuple[str, str, str, str], Entry] = field(default_factory=dict)

    def link(self, rank_a: int, rank_b: int) -> str:
        """Link class by this ledger's own node map (which overrides the mesh's)."""
        return link_class(rank_a, rank_b, self.node_of_rank)

    def add(self, op: str, group: str, link: str, nbytes: int, calls: int = 1) -> None:
        _book(self.entries, op, group, link, nbytes, calls)

    def skip(self, op: str, group: str, link: str, nbytes: int, calls: int = 1) -> None:
        """Book a message the schedule skipped (its bytes under `bytes_sent` of `skipped`)."""
        _book(self.skipped, op, group, link, nbytes, calls)

    def total(self, phase: str | None = None, op: str | None = None, link: str | None = None,
              group: str | None = None) -> int:
        """Bytes sent, summed over the entries that match every given filter."""
        return _sum(self.entries, phase, op, link, group)

    def skipped_total(self, phase: str | None = None, op: str | None = None,
                      link: str | None = None, group: str | None = None) -> int:
        """Bytes skipped (not sent), summed over the skipped entries that match every filter."""
        return _sum(self.skipped, phase, op, link, group)

    def to_dict(self) -> dict:
        return {"entries": [asdict(e) for e in self.entries.values()], "flops": dict(self.flops),
                "skipped": [asdict(e) for e in self.skipped.values()]}


def _book(entries: dict[tuple[str, str, str, str], Entry], op: str, group: str, link: str,
          nbytes: int, calls: int) -> None:
    phase = _phase.get()
    key = (op, group, link, phase)
    entry = entries.get(key)
    if entry is None:
        entry = entries[key] = Entry(op, group, link, phase)
    entry.bytes_sent += int(nbytes)
    entry.calls += calls


def _sum(entries: dict[tuple[str, str, str, str], Entry], phase: str | None, op: str | None,
         link: str | None, group: str | None) -> int:
    return sum(
        e.bytes_sent
        for e in entries.values()
        if (phase is None or e.phase == phase)
        and (op is None or e.op == op)
        and (link is None or e.link == link)
        and (group is None or e.group == group)
    )


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Book communication and FLOPs inside the block under `name` ('forward' or 'backward')."""
    token = _phase.set(name)
    try:
        yield
    finally:
        _phase.reset(token)


@contextlib.contextmanager
def recording(node_of_rank: Sequence[int] | None = None) -> Iterator[Ledger]:
    """Record every communication and kernel call made inside the block into a new Ledger.

    node_of_rank maps each global rank to a node id and overrides the node map of the mesh each
    communication runs on (by default the mesh's map classifies links).
    Recordings nest: an outer ledger sees what an inner one sees.
    """
    ledger = Ledger(node_of_rank=list(node_of_rank) if node_of_rank is not None else None)
    token = _ledgers.set(_ledgers.get() + (ledger,))
    try:
        yield ledger
    finally:
        _ledgers.reset(token)


def active() -> tuple[Ledger, ...]:
    return _ledgers.get()


@contextlib.contextmanager
def _booking(saved: tuple[Ledger, ...], phase_name: str) -> Iterator[None]:
    """Book into `saved` under `phase_name` inside the block, on whichever thread runs it."""
    token_l = _ledgers.set(saved)
    token_p = _phase.set(phase_name)
    try:
        yield
    finally:
        _phase.reset(token_p)
        _ledgers.reset(token_l)


def backward_of(saved: tuple[Ledger, ...]) -> contextlib.AbstractContextManager[None]:
    """Inside an autograd backward: book into the ledgers active at forward time, as 'backward'.

    Autograd may run backward on another thread (CUDA), where the forward's context is not set.
    """
    return _booking(saved, "backward")


def replay_of(saved: tuple[Ledger, ...]) -> contextlib.AbstractContextManager[None]:
    """A forward recomputed inside backward (activation checkpointing): book into the ledgers active
    when the forward first ran, as 'forward', on whichever thread autograd runs it."""
    return _booking(saved, "forward")


def add_flops(flops: float) -> None:
    for ledger in _ledgers.get():
        ledger.flops[_phase.get()] += flops
