"""What the benchmark scripts share: virtual nodes with an emulated inter-node link, and the
numbers read off the ranks' measurements."""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Iterator, Sequence

from seqpar.algorithms import comm, ledger


@contextlib.contextmanager
def emulated_nodes(nodes: Sequence[int], link: comm.LinkModel | None) -> Iterator[None]:
    """In this rank: node map `nodes` (rank -> node) and, when given, `link` on inter-node hops."""
    ledger.set_topology(nodes)
    comm.set_link_emulation({"inter": link} if link is not None else None)
    try:
        yield
    finally:
        comm.set_link_emulation(None)
        ledger.set_topology(None)


def step_ms(results) -> float:
    """Median over iterations of the slowest rank's step."""
    iters = len(results[0].step_ms)
    return statistics.median(max(r.step_ms[i] for r in results) for i in range(iters))


def most_bytes(results, **match) -> int:
    """The most bytes any rank sent over the ledger entries matching every given field."""
    return max(sum(e["bytes_sent"] for e in r.ledger["entries"]
                   if all(e[k] == v for k, v in match.items())) for r in results)
