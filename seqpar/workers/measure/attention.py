"""Modes fwd and fwd+bwd: the attention benchmark on one rank. Random shards in the case's layout,
then the loop (`timing.iterate`): warm-up, timed passes under the memory meter, the ledger of one.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from seqpar import algorithms
from seqpar.algorithms import layouts
from seqpar.algorithms.base import DTYPES
from seqpar.algorithms.comm import Links
from seqpar.algorithms.mesh import Mesh
from seqpar.case import Case
from seqpar.workers.measure.record import RankMeasurement, rank_record
from seqpar.workers.measure.timing import iterate, timed_pass


def local_inputs(case: Case, rank: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """This rank's q, k, v and upstream gradient, drawn from (seed, rank) at shard size."""
    g = torch.Generator().manual_seed(case.seed * 1_000_003 + rank)
    s = len(layouts.positions(case.layout, rank, case.world, case.seq_len, case.cu_seqlens or None,
                              case.attention_mask))
    dtype = DTYPES[case.dtype]
    shapes = [(case.batch, s, case.heads, case.head_dim), (case.batch, s, case.kv_heads, case.head_dim),
              (case.batch, s, case.kv_heads, case.head_dim), (case.batch, s, case.heads, case.head_dim)]
    return tuple(torch.randn(*sh, generator=g).to(device=device, dtype=dtype) for sh in shapes)


def build(case: Case, group: dist.ProcessGroup | None, mesh: Mesh | None = None,
          nodes: Sequence[int] | None = None, links: Links | None = None):
    """The case's distributed attention (its mesh from `group`, `nodes` and `links`, or the given
    `mesh`)."""
    return algorithms.build_attention(case.algorithm, causal=case.causal, layout=case.layout,
                                      group=group, mesh=mesh, nodes=nodes, links=links,
                                      window=case.window, mask=case.attention_mask,
                                      **case.option_dict)


def measure_attention(case: Case, rank: int, group: dist.ProcessGroup | None,
                      device: torch.device | str = "cpu", *, nodes: Sequence[int] | None = None,
                      links: Links | None = None, mesh: Mesh | None = None) -> RankMeasurement:
    """Run the case on this rank: warm-up, then `iters` timed iterations (fwd, or fwd+bwd).

    The algorithm's mesh is built from `group` with the node map `nodes` (every rank of the group
    calls this), unless a prebuilt `mesh` is given. With documents (case.cu_seqlens) the shards are
    dealt per document and every call passes them; with a window or any mask (case.mask) the
    attention is built with it."""
    device = torch.device(device)
    attn = build(case, group, mesh, nodes, links)
    q0, k0, v0, dout = local_inputs(case, rank, device)
    docs = {"cu_seqlens": case.cu_seqlens} if case.cu_seqlens else {}
    backward = case.mode == "fwd+bwd"

    def one_pass() -> tuple[float, float, None]:
        fwd_s, bwd_s, _ = timed_pass(attn, (q0, k0, v0), dout if backward else None, docs,
                                     group, device)
        return fwd_s, bwd_s, None

    return rank_record(case, rank, device, iterate(one_pass, case.warmup, case.iters, device))
