"""What the benchmark scripts share: an emulated inter-node link, and the numbers read off the
ranks' measurements. (The node map and the emulated links go into the trial's mesh:
`measure(..., nodes=, links=)`.)"""

from __future__ import annotations

import statistics

from seqpar.algorithms import comm


def inter_link(link: comm.LinkModel | None) -> dict[str, comm.LinkModel] | None:
    """The `links` that emulate `link` on inter-node hops (which hops those are, the mesh says)."""
    return {"inter": link} if link is not None else None


def step_ms(results) -> float:
    """Median over iterations of the slowest rank's step."""
    iters = len(results[0].step_ms)
    return statistics.median(max(r.step_ms[i] for r in results) for i in range(iters))


def most_bytes(results, **match) -> int:
    """The most bytes any rank sent over the ledger entries matching every given field."""
    return max(sum(e["bytes_sent"] for e in r.ledger["entries"]
                   if all(e[k] == v for k, v in match.items())) for r in results)
