"""What the benchmark scripts share: an emulated inter-node link, and the numbers read off the
ranks' measurements. (The node map itself goes into the trial's mesh: `measure(..., nodes=)`.)"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Iterator

from seqpar.algorithms import comm


@contextlib.contextmanager
def emulated_link(link: comm.LinkModel | None) -> Iterator[None]:
    """In this rank, when given: `link` on inter-node hops (which hops those are, the mesh says)."""
    comm.set_link_emulation({"inter": link} if link is not None else None)
    try:
        yield
    finally:
        comm.set_link_emulation(None)


def step_ms(results) -> float:
    """Median over iterations of the slowest rank's step."""
    iters = len(results[0].step_ms)
    return statistics.median(max(r.step_ms[i] for r in results) for i in range(iters))


def most_bytes(results, **match) -> int:
    """The most bytes any rank sent over the ledger entries matching every given field."""
    return max(sum(e["bytes_sent"] for e in r.ledger["entries"]
                   if all(e[k] == v for k, v in match.items())) for r in results)
