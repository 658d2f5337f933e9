"""Each algorithm's rules without torch (see base.py): the registry the planner reads, and the
class-level questions one asks of an algorithm by name — its grid, its rules, its bytes per rank
under a call's layout and mask, its tuning space. `get` also answers the peers' names (`peer:...`,
their rules in `seqpar.rules.peers`), so a sweep of peers can be planned; `REGISTRY` holds seqpar's
own algorithms only, the ones the planner's search, the tuner and `seqpar check` range over.
`seqpar.algorithms` answers the same questions for its own registry (the torch classes, which
subclass these, and the peers) with the `*_of` functions below."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from seqpar.errors import require
from seqpar.rules import masks
from seqpar.rules import peers as peer_rules
from seqpar.rules.algorithms.allgather import AllGatherRules
from seqpar.rules.algorithms.base import Geometry, Rules, call_relation
from seqpar.rules.algorithms.burst import BurstRules
from seqpar.rules.algorithms.double_ring import DoubleRingRules
from seqpar.rules.algorithms.local import LocalRules
from seqpar.rules.algorithms.ring import RingRules
from seqpar.rules.algorithms.ulysses import UlyssesRules
from seqpar.rules.algorithms.usp import UspRules
from seqpar.rules.algorithms.wallfacer import WallFacerRules
from seqpar.rules.grids import Grid
from seqpar.rules.layouts import check_layout
from seqpar.rules.options import Options
from seqpar.rules.shape import PHASES, AttnShape

REGISTRY: dict[str, type[Rules]] = {c.name: c for c in (
    LocalRules, AllGatherRules, UlyssesRules, RingRules, UspRules, DoubleRingRules, WallFacerRules,
    BurstRules)}


def get(name: str) -> type[Rules]:
    """The rules of one of seqpar's algorithms or (a `peer:` name) of a peer."""
    if isinstance(name, str) and name.startswith(peer_rules.PREFIX):
        require(name in peer_rules.PEERS, "algorithm", name,
                f"must be one of {', '.join(peer_rules.PEERS)}")
        return peer_rules.PEERS[name]
    require(name in REGISTRY, "algorithm", name, f"must be one of {', '.join(REGISTRY)}")
    return REGISTRY[name]


MLA_PASSES = ("kv", "latent")  # what an MLA model's ring carries: each rank's K,V or its latent


def check_mla_pass(mla_pass: str, mla: bool, algorithm: str, checkpoint: str = "none") -> None:
    """mla_pass (a model's attention option): 'kv' (K,V rebuilt where the latent is made, then any
    algorithm) or 'latent' (the ring family carries the latent, `Rules.latent_pass`), which needs
    a model with multi-head latent attention and a checkpointing mode that does not re-run a
    prefix of the attention itself (seq-attn)."""
    require(mla_pass in MLA_PASSES, "mla_pass", mla_pass, f"must be one of {', '.join(MLA_PASSES)}")
    if mla_pass == "kv":
        return
    require(mla, "mla_pass", mla_pass,
            "needs a model with multi-head latent attention (model.kv_lora_rank > 0)")
    require(get(algorithm).latent_pass, "mla_pass", mla_pass,
            f"carries the latent on a ring: ring, double_ring, usp, burst or wallfacer, not {algorithm} "
            "(ulysses and allgather move K,V heads after the up-projection: mla_pass kv)")
    require(checkpoint != "seq-attn", "mla_pass", mla_pass,
            "does not run under checkpoint seq-attn (its prefix re-runs the attention on K,V)")


def grid_of(cls: type[Rules], world: int, nodes: Sequence[int] | None = None,
            **options: Any) -> Grid:
    """The rank grid `cls` lays on `world` ranks (nodes: each rank's node id)."""
    opts = cls.parse(options)
    opts.check(world)
    return cls.grid(world, opts, nodes)


def check_of(cls: type[Rules], shape: AttnShape, world: int, layout: str = "contiguous",
             causal: bool = True, **options: Any) -> None:
    """Every rule of `cls` for this configuration."""
    check_layout(layout)
    cls.check(shape, world, layout, causal, options)


def expected_bytes_of(cls: type[Rules], shape: AttnShape, world: int, *,
                      layout: str | None = None, causal: bool = True,
                      cu_seqlens: Sequence[int] | None = None, window: int | None = None,
                      mask: masks.Mask | None = None, rank: int | None = None,
                      **options: Any) -> dict[str, int]:
    """Analytic bytes one rank sends per call, by phase: the most any rank sends, or `rank`'s. With
    the call's layout and relation (causal, cu_seqlens, window, or any `mask`) the count is net of
    the transfers the schedule skips (option skip_transfers); without a layout it is the unskipped
    count."""
    opts = cls.parse(options)
    if layout is None and rank is None:
        return cls.expected_bytes(shape, world, opts)
    geometry = None if layout is None else Geometry.of(shape, world, layout, causal, cu_seqlens,
                                                       window, mask)
    ranks = range(world) if rank is None else (rank,)
    per_rank = [cls.bytes_of_rank(shape, world, opts, r, geometry) for r in ranks]
    return {p: max(b[p] for b in per_rank) for p in PHASES}


def skipped_bytes_of(cls: type[Rules], shape: AttnShape, world: int, *, layout: str,
                     causal: bool = True, cu_seqlens: Sequence[int] | None = None,
                     window: int | None = None, mask: masks.Mask | None = None,
                     rank: int | None = None, **options: Any) -> dict[str, int]:
    """Bytes per phase the schedule does not send under this relation or mask because no query of
    the ranks a block would reach sees it (0 for algorithms without a ring): `rank`'s, or (rank
    None) how far the busiest rank's count falls."""
    opts = cls.parse(options)
    if rank is not None:
        geometry = Geometry.of(shape, world, layout, causal, cu_seqlens, window, mask)
        return cls.skipped_bytes(shape, world, opts, rank, geometry)
    full = expected_bytes_of(cls, shape, world, **options)
    net = expected_bytes_of(cls, shape, world, layout=layout, causal=causal,
                            cu_seqlens=cu_seqlens, window=window, mask=mask, **options)
    return {p: full[p] - net[p] for p in PHASES}


def defaults_of(cls: type[Rules]) -> Mapping[str, Any]:
    """The options an algorithm takes, with their defaults."""
    return cls.Options().as_dict()


def options_of(name: str) -> Mapping[str, Any]:
    """`defaults_of` by name."""
    return defaults_of(get(name))


def option_space_of(cls: type[Rules], world: int) -> list[dict[str, Any]]:
    """Every configuration worth tuning at `world` ranks (the options' `space`): the algorithm's
    own options (not the kernel, scale and gradient dtype every algorithm takes)."""
    common = Options.names()
    return [{k: v for k, v in o.as_dict().items() if k not in common}
            for o in cls.Options.space(world)]


def expected_bytes(name: str, shape: AttnShape, world: int, **kwargs: Any) -> dict[str, int]:
    """`expected_bytes_of` by name."""
    return expected_bytes_of(get(name), shape, world, **kwargs)


def grid_for(name: str, world: int, nodes: Sequence[int] | None = None, **options: Any) -> Grid:
    """`grid_of` by name."""
    return grid_of(get(name), world, nodes, **options)


def check(name: str, shape: AttnShape, world: int, layout: str = "contiguous",
          causal: bool = True, **options: Any) -> None:
    """`check_of` by name."""
    check_of(get(name), shape, world, layout, causal, **options)


def option_space(name: str, world: int) -> list[dict[str, Any]]:
    """`option_space_of` by name."""
    return option_space_of(get(name), world)


__all__ = ["MLA_PASSES", "PHASES", "REGISTRY", "AttnShape", "Geometry", "Grid", "Options", "Rules",
           "call_relation", "check", "check_mla_pass", "check_of", "defaults_of", "expected_bytes",
           "expected_bytes_of", "get", "grid_for", "grid_of", "option_space", "option_space_of",
           "options_of", "skipped_bytes_of"]
