"""What ranks that share a host's cores cost one another beyond their own work (a CPU host:
`Cluster.cores`), per micro-batch of a training step. Two effects, each measured by `seqpar
calibrate` on the host (`sweeps.calibrate.host.step_waits`):

- **spread** (`Cluster.spread`): ranks given equal work side by side do not finish together (a
  shared VM's cores each run at a speed of their own from moment to moment: this project's 2-core
  VM ran the last of two ranks' equal GEMMs 14-16% past their mean, at 1.5 and at 15 ms a piece).
  An SP group's ranks meet at every layer's exchange, so a stage whose ranks are balanced ends
  when its slowest rank does: max(busiest, mean x (1 + spread)). The layers' GEMMs are balanced
  (each rank its own tokens), and so is a head-parallel attention (Ulysses) and a linear layer's
  chunk; a ring's causal blocks under a contiguous layout are not (rank P-1 sees P times rank 0's
  keys): the busiest rank sets the pace there and the others' spread is hidden in their slack.
- **the transport's threads** (`Cluster.transport_cpu_us`): gloo posts each message and
  collective to threads of its own, whose CPU comes from the same cores. Where a rank idles
  waiting for the busiest (the slack above) they run there; where every rank computes, they
  take it from the compute: max(0, their CPU - the mean rank's slack) a micro-batch.

Both are for ranks a core each: where ranks outnumber the cores they take turns on them, which
the waits measured with as many ranks (`Cluster.waits_us`) already hold, and a GPU cluster (no
`cores`) has neither: 0 there. What was measured and what it moved: `docs/planner.md`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from seqpar.planner import host
from seqpar.planner.api import Prediction
from seqpar.planner.clusters import Cluster
from seqpar.planner.setup import Setup
from seqpar.rules.blocks import imbalance, rank_pairs

# algorithms whose ranks' attention work is equal at any layout (head-parallel, or one rank); the
# others' ranks each attend their own queries over every key (a ring's, a gather's): the layout's
BALANCED = ("ulysses", "local")


def spread(c: Cluster, world: int) -> float:
    """The spread of `world` ranks side by side (`Cluster.spread`: the entry of the most ranks up
    to `world`, else the fewest; 0 where none is measured)."""
    return host.by_ranks(c.spread, world, 0.0)


def transport_cpu(c: Cluster, world: int) -> tuple[float, float]:
    """(seconds, seconds) of the transport threads' CPU a message and a collective cost a rank
    (`Cluster.transport_cpu_us`, by ranks as `spread`)."""
    message, collective = host.by_ranks(c.transport_cpu_us, world, (0.0, 0.0))
    return message * 1e-6, collective * 1e-6


def attention_imbalance(setup: Setup, sp: int, attn: Prediction, kind: str) -> float:
    """max / mean of a layer's attention work over the SP group's ranks (1: balanced): a linear
    layer's and a head-parallel algorithm's 1, a ring-like algorithm's its layout's over its
    ring (USP's: over sp / dhp ranks); memoised a configuration."""
    ring = sp // int(attn.options.get("dhp") or 1) if attn.algorithm == "usp" else sp
    if kind == "linear" or attn.algorithm in BALANCED or ring < 2:
        return 1.0
    key = ("imbalance", attn.layout, ring, kind)
    got = setup.cache.get(key)
    if got is None:
        relation = setup.sliding_mask if kind == "sliding" else None
        relation = relation or setup.mask or setup.causal
        got = setup.cache[key] = imbalance(rank_pairs(attn.layout, ring, setup.seq_len,
                                                      relation))
    return got


def micro_seconds(setup: Setup, sp: int, world: int, attn: Prediction, train: Any,
                  blocks: Sequence[Any], head: float, linear_sp: str | None = None) -> float:
    """Seconds a micro-batch of `blocks` (`planner.step.Block`, one per `setup.classes`) and
    `head` (its LM head and loss) spends beyond its busiest rank's work on a host whose `world`
    ranks share its cores (the module docstring; `linear_sp`: the LASP mode of its linear
    layers); 0 on a GPU cluster or a single rank."""
    c = setup.cluster
    if c.cores is None or not 2 <= world <= c.cores or not (c.spread or c.transport_cpu_us):
        return 0.0  # more ranks than cores: they take turns, `Cluster.waits_us` holds that
    s = spread(c, world) if sp > 1 else 0.0
    extra = slack = 0.0
    for cl, b in zip(setup.classes, blocks, strict=True):
        imb = attention_imbalance(setup, sp, attn, cl.kind)
        mean = b.kernels / imb
        extra += b.count * (max(b.kernels, mean * (1 + s)) - b.kernels + (b.other + b.recompute) * s)
        slack += b.count * (b.kernels - mean)
    extra += head * s
    return extra + max(0.0, _transport(setup, sp, world, attn, train, linear_sp) - slack)


def _transport(setup: Setup, sp: int, world: int, attn: Prediction, train: Any,
               linear_sp: str | None = None) -> float:
    """The transport threads' CPU of a micro-batch's messages and collectives on one rank
    (`host.step_issue`'s counts, the step's issue's own)."""
    message, collective = transport_cpu(setup.cluster, world)
    return sum(i.messages * message + (i.collectives + i.queued) * collective
               for i, _ in host.step_issue(setup, attn, train, sp, linear_sp))
