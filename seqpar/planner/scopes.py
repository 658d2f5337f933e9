"""Every valid configuration ranked by predicted time (what `seqpar plan` prints at the attention
and model scopes; the cluster scope is `search.search`), with the model a plan names: held apart
from the predictions held against a sweep (`plan.validate`, with the lengths' rules), so a plan
starts without those."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from seqpar.errors import ConfigError, require
from seqpar.planner.api import Prediction, predict
from seqpar.planner.clusters import Cluster
from seqpar.planner.policy import Filters
from seqpar.planner.rates import DEFAULT_KERNEL, with_kernel
from seqpar.planner.search import Result, check_counts, make_setup, search
from seqpar.planner.setup import shape_of
from seqpar.rules import algorithms, masks
from seqpar.rules.counts import model_params
from seqpar.rules.layouts import LAYOUTS
from seqpar.rules.model import load, presets
from seqpar.rules.shape import DTYPE_BYTES, SHAPE_PRESETS, AttnShape

Space = Iterable[tuple[str, Mapping[str, Any]]]


def model_shape(model: str, seq_len: int, dtype: str = "bfloat16") -> tuple[AttnShape, Any]:
    """(attention shape, ModelConfig or None) for a model: a ModelConfig preset, a YAML of its
    fields or a Hugging Face config.json (`seqpar.rules.model.load`), else an attention-shape
    preset (`rules.shape.SHAPE_PRESETS`, attention scope only)."""

    elem = DTYPE_BYTES[dtype]
    if model in SHAPE_PRESETS and model not in presets():
        s = SHAPE_PRESETS[model]
        return AttnShape(1, seq_len, s["heads"], s["kv_heads"], s["head_dim"], elem), None
    if model not in presets() and not model.endswith((".yaml", ".yml", ".json")):
        names = ", ".join(sorted({*presets(), *SHAPE_PRESETS}))
        require(False, "model", model, f"must be one of {names}, a YAML file of ModelConfig's "
                "fields or a Hugging Face config.json")
    cfg = load(model)
    return shape_of(cfg, seq_len, elem_bytes=elem), cfg


def model_params_of(model: str) -> dict[str, int] | None:
    """`--json`'s `model_params` of a model (`rules.counts.model_params`: {"total", "active"});
    None for an attention-shape preset, which names no decoder."""
    cfg = model_shape(model, 1)[1]
    return None if cfg is None else model_params(cfg)


def model_search(cluster: Cluster, model: str, seq_len: int, world: int, space: Space, *,
                 nodes: int = 1, layouts: Sequence[str] = LAYOUTS, causal: bool = True,
                 dtype: str = "bfloat16", kernel: str = DEFAULT_KERNEL,
                 filters: Filters | None = None, mask: str | None = None,
                 every: bool = False, routing_skew: float = 1.0) -> Result:
    """The model scope's search: the whole step (`step.Step`) of every configuration of one SP
    group of `world` ranks (DP = 1, one sequence a step) and policy, fitting ones first by TGS
    (`search.search`: dominated attention configurations pruned, or with `every` listed once
    each, marked)."""
    check_counts(seq_len=seq_len, world=world, nodes=nodes)
    cfg = model_shape(model, seq_len, dtype)[1]
    require(cfg is not None, "model", model, "--scope model needs a decoder (a ModelConfig "
            "preset, a YAML of its fields or a config.json), not an attention shape")
    f = replace(filters or Filters(), dp=1, sp=world)
    setup = make_setup(cluster, cfg, seq_len, seq_len, world, nodes, kernel=kernel, dtype=dtype,
                       causal=causal, mask=mask, ep=f.ep, routing_skew=routing_skew)
    return search(setup, f, attention=list(space), layouts=layouts, every=every)


def rank(cluster: Cluster, model: str, seq_len: int, world: int, space: Space, *, nodes: int = 1,
         scope: str = "attention", layouts: Sequence[str] = LAYOUTS, causal: bool = True,
         dtype: str = "bfloat16", kernel: str = DEFAULT_KERNEL,
         filters: Filters | None = None, mask: str | None = None) -> list[Any]:
    """Attention scope: a Prediction for every valid (algorithm, options, layout), fitting ones
    first by time. Model scope: `model_search`'s ranked steps. `mask`: any mask's spec
    (`masks.parse`) in place of plain causal attention."""
    require(scope in ("attention", "model"), "scope", scope, "must be attention or model")
    check_counts(seq_len=seq_len, world=world, nodes=nodes)
    shape, cfg = model_shape(model, seq_len, dtype)
    if scope == "model":
        return model_search(cluster, model, seq_len, world, space, nodes=nodes, layouts=layouts,
                            causal=causal, dtype=dtype, kernel=kernel, filters=filters,
                            mask=mask).ranked
    cluster = with_kernel(cluster, kernel, shape.head_dim, dtype)[0]
    m = None if mask is None else masks.parse(mask, seq_len)
    causal = causal if m is None else m.causal
    out: list[Prediction] = []
    for name, options in space:
        for layout in layouts:
            try:
                algorithms.check(name, shape, world, layout, causal, **options)
            except ConfigError:
                continue
            out.append(predict(cluster, name, shape, world, nodes=nodes, options=options,
                               layout=layout, causal=causal, dtype=dtype, mask=m))
    return sorted(out, key=lambda p: (not p.fits, p.attention_ms))


def _same(p: Prediction) -> tuple:
    """What two configurations must share to be one row: every predicted number (to 1e-9)."""
    def r(x: float | None) -> float | None:
        return None if x is None else float(f"{x:.9g}")

    return (p.algorithm, p.fits, p.bottleneck, r(p.attention_ms), r(p.forward_ms), r(p.compute_ms),
            r(p.exposed_ms["intra"]), r(p.exposed_ms["inter"]), p.bytes_intra, p.bytes_inter,
            p.peak_mem_bytes, r(p.step_ms), r(p.mfu))


def equivalents(ranked: Sequence[Prediction]) -> list[list[Prediction]]:
    """The ranked configurations in groups of one algorithm whose predictions are identical (a
    layout or an option that changes nothing at this shape: ulysses's layout, usp's inner ring
    when its context ring is one node), in rank order of each group's first member."""
    groups: dict[tuple, list[Prediction]] = {}
    for p in ranked:
        groups.setdefault(_same(p), []).append(p)
    return list(groups.values())
