"""The operation table's rows for the layer kinds other than LLaMA's (`optable` writes them with
the rest; `seqpar.rules.ops` reads them): what an MLA layer and a linear-attention layer (gated
DeltaNet) issue outside their SP attention, the delta rule's own share of the latter, what a
linear layer's LASP exchange adds on a group of d ranks, and what each family's features add to
LLaMA's block.

- kinds: per checkpoint mode, an MLA block without and with a query bottleneck (`mla`, `mla_q`)
  and a linear block (the difference of a model of a full layer and one of that kind and of the
  full layer alone); the linear block at 1, 2, 3, 4 and 8 chunks of the chunked rule
  (`rules.linear.CHUNK` tokens each), a law a + b * chunks through 2 and 4 (1 chunk is a row of
  its own: a single chunk's slices need no copies); `rule`: the delta rule alone, the same way.
- lasp: per mode (lasp2, lasp1) and group size, the busiest rank's DeltaNet under LASP less the
  same call on one rank (its halo and state messages, LASP-2's all-gather and reduce-scatter and
  its scan over the earlier ranks' pairs), at two chunks a rank (the exchange does not depend on
  them); a law a + b * (d - 1) through 3 and 4, checked at 8 (at 2 no rank both sends and
  receives: a row of its own).
- features: per checkpoint mode, what each of `rules.ops.FEATURES` adds to a LLaMA-kind layer (its
  attention call's count too: the sinks' ops are the call's), over LLaMA's block and over one with
  Gemma's norms (norm_offset's own row: its delta over LLaMA's), the difference of a 2-layer and a
  1-layer model of the tiny shape with the feature (`FEATURE_FIELDS`) and without.
  feature_checks: each combination a preset model's layers have (`preset_combinations`), measured
  whole, against the sum of its features' rows (`holds`).
"""

from __future__ import annotations

from typing import Any

import torch

from seqpar.algorithms.comm import Comm
from seqpar.algorithms.delta_rule import delta_rule
from seqpar.algorithms.lasp import Lasp
from seqpar.model import ModelConfig, Transformer, deltanet
from seqpar.rules import ops as rules_ops
from seqpar.rules.linear import CHUNK
from seqpar.rules.memory import CHECKPOINT_MODES
from seqpar.rules.model import load, param_shapes, preset_names
from seqpar.rules.rope import Rope
from seqpar.workers.measure import opcount as base
from seqpar.workers.measure.opcount import OpCounter

PHASES = ("forward", "backward")
# DeepSeek's latent attention as it is published: interleaved rope key, value heads narrower than
# query heads (nope + rope dims); a linear layer in Qwen3-Next's zero-centred (1 + w) norms
MLA_SHAPE = {"kv_lora_rank": 16, "qk_rope_dim": 4, "head_dim": 12, "v_head_dim": 8,
             "rope_interleave": True}
MLA = {"mla": MLA_SHAPE, "mla_q": {**MLA_SHAPE, "q_lora_rank": 8}}
LINEAR = {"lin_k_heads": 2, "lin_v_heads": 4, "lin_k_dim": 8, "lin_v_dim": 8, "conv_kernel": 4,
          "norm_offset": True}
CHUNKS, FIT_CHUNKS = (1, 2, 3, 4, 8), (2, 4)
LASP_SIZES, FIT_SIZES = (2, 3, 4, 8), (3, 4)
LASP_CHUNKS = 2
# each of rules.ops.FEATURES as the tiny model's fields (nope: no layer rotates, `feature_config`)
FEATURE_FIELDS = {"qkv_bias": {"qkv_bias": True}, "o_bias": {"o_bias": True},
                  "mlp_bias": {"mlp_bias": True}, "qk_norm": {"qk_norm": True},
                  "attn_gate": {"attn_gate": True}, "partial_rotary": {"rope": Rope(fraction=0.5)},
                  "nope": {}, "sandwich_norms": {"sandwich_norms": True},
                  "norm_offset": {"norm_offset": True}, "gelu_tanh": {"act": "gelu_tanh"},
                  "swiglu_oai": {"act": "swiglu_oai", "swiglu_limit": 7.0},
                  "sinks": {"sinks": True}}


def _tokens(n: int) -> torch.Tensor:
    return torch.randint(0, base.CONFIG["vocab"], (1, n + 1),
                         generator=torch.Generator().manual_seed(0))


def kind_block(kind: str, mode: str = "none", chunks: int = LASP_CHUNKS) -> dict[str, dict]:
    """One layer of `kind` (mla, mla_q, linear) outside its attention under checkpoint `mode`, on
    `chunks` chunks of tokens, forward and backward."""
    extra, second = (LINEAR, "linear") if kind == "linear" else (MLA[kind], "full")
    got = [base.count_model(Transformer(ModelConfig(layers=len(types), layer_types=types,
                                                    **base.CONFIG, **extra),
                                        checkpoint=mode, seq_fraction=0.5), _tokens(CHUNK * chunks))
           for types in (("full", second), ("full",))]
    return {ph: base.minus(got[0][ph]["other"], got[1][ph]["other"]) for ph in PHASES}


def count_rule(chunks: int) -> dict[str, dict]:
    """The delta rule (torch backend) over `chunks` chunks, forward and backward, at the linear
    layer's heads and dims."""
    gen = torch.Generator().manual_seed(0)
    s, h, dk, dv = CHUNK * chunks, LINEAR["lin_v_heads"], LINEAR["lin_k_dim"], LINEAR["lin_v_dim"]
    q, k, v = (torch.randn(1, s, h, n, generator=gen).requires_grad_() for n in (dk, dk, dv))
    g, beta = (torch.rand(1, s, h, generator=gen) * sign for sign in (-1.0, 1.0))
    g, beta = g.requires_grad_(), beta.requires_grad_()
    grad = torch.randn(1, s, h, dv, generator=gen)
    with OpCounter() as c:
        with c.phase("forward"):
            o = delta_rule(q, k, v, g, beta, dk ** -0.5, backend="torch")[0]
        with c.phase("backward"):
            o.backward(grad)
    return {ph: {f: c.total(ph).as_dict()[f] for f in base.FIELDS} for ph in PHASES}


def count_mixer(env, mode: str, d: int) -> dict[str, dict[str, Any]]:
    """A linear layer's DeltaNet under LASP `mode` on the gang's first d ranks (d = 1: alone), at
    LASP_CHUNKS chunks a rank: this rank's counts, forward and backward (after a warm call)."""
    cfg = ModelConfig(layers=1, layer_types=("linear",), **base.CONFIG, **LINEAR)
    gen = torch.Generator().manual_seed(env.rank)
    p = {n: (0.1 * torch.randn(param_shapes(cfg)[f"blocks.0.{n}"], generator=gen)
             ).requires_grad_() for n in deltanet.LINEAR}
    mixer = deltanet.DeltaNet(Lasp(Comm(env.group(d)), mode, "torch"))
    h = torch.randn(1, CHUNK * LASP_CHUNKS, cfg.hidden, generator=gen).requires_grad_()
    grad = torch.randn(h.shape, generator=gen)
    for counting in (False, True):
        with OpCounter() as c:
            with c.phase("forward"):
                out = mixer(h, p, cfg)
            with c.phase("backward"):
                out.backward(grad)
        if counting:
            return {ph: c.total(ph).as_dict() for ph in PHASES}
    raise AssertionError


def lasp_counts(gang, mode: str, d: int, alone: dict | None = None) -> dict[str, dict]:
    """What LASP `mode` adds to a linear layer on the busiest of d ranks (`alone`: the call on one
    rank, counted here where not given)."""
    alone = alone or gang.run(count_mixer, mode, 1, size=1)[0]
    got = base.busiest(gang.run(count_mixer, mode, d, size=d))
    return {ph: base.minus(got[ph], alone[ph]) for ph in PHASES}


def law(points: dict[int, dict], fit: tuple[int, int], offset: int = 0) -> dict[str, Any]:
    """Per phase, count(x) = a + b * (x - offset) through the points at `fit`, whether it gives the
    other points above the first exactly, and the points."""
    out: dict[str, Any] = {"law": {}, "holds": True,
                           "points": {str(x): row for x, row in sorted(points.items())}}
    for ph in PHASES:
        got = base.linear([(x - offset, points[x][ph]) for x in fit],
                          check=[(x - offset, points[x][ph]) for x in points
                                 if x > min(fit) and x not in fit])
        out["law"][ph], out["holds"] = got["law"], out["holds"] and got["holds"]
    return out


def feature_config(names: tuple[str, ...], layers: int) -> ModelConfig:
    """The tiny model of `layers` layers with the FEATURES `names` (`FEATURE_FIELDS`)."""
    fields = {k: v for name in names for k, v in FEATURE_FIELDS[name].items()}
    if "nope" in names:
        fields["nope_layers"] = tuple(range(layers))
    return ModelConfig(layers=layers, **base.CONFIG, **fields)


def feature_block(names: tuple[str, ...], mode: str = "none") -> dict[str, dict]:
    """A LLaMA-kind layer with the FEATURES `names` under checkpoint `mode`, its attention call's
    count too (a local call's), forward and backward."""
    got = [base.count_model(Transformer(feature_config(names, n), checkpoint=mode,
                                        seq_fraction=0.5), _tokens(CHUNK)) for n in (2, 1)]
    return {ph: {f: sum(got[0][ph][p][f] - got[1][ph][p][f] for p in ("attention", "other"))
                 for f in base.FIELDS} for ph in PHASES}


def _minus(a: dict, b: dict) -> dict[str, dict]:
    return {ph: base.minus(a[ph], b[ph]) for ph in PHASES}


def feature_rows(mode: str) -> dict[str, Any]:
    """Under checkpoint `mode`, each feature's row of the table's `features`."""
    llama, offset = feature_block((), mode), feature_block(("norm_offset",), mode)
    rows = {f"norm_offset|{mode}": {"llama": _minus(offset, llama)}}
    for name in rules_ops.FEATURES:
        if name != "norm_offset":
            rows[f"{name}|{mode}"] = {
                "llama": _minus(feature_block((name,), mode), llama),
                "norm_offset": _minus(feature_block(("norm_offset", name), mode), offset)}
    return rows


def preset_combinations() -> list[tuple[str, ...]]:
    """The combinations of two features or more that a preset model's LLaMA-kind layers have."""
    got = set()
    for name in preset_names():
        cfg = load(name)
        if not cfg.mla:
            got.update(rules_ops.layer_features(cfg, i) for i, kind in enumerate(cfg.layer_types)
                       if kind != "linear")
    return sorted(c for c in got if len(c) > 1)


def feature_sum_holds(names: tuple[str, ...], mode: str, rows: dict[str, Any]) -> bool:
    """Whether a layer with the FEATURES `names`, measured whole, issues what LLaMA's block and
    the features' `rows` give."""
    whole = _minus(feature_block(names, mode), feature_block((), mode))
    summed = {ph: rules_ops.feature_deltas(names, mode, ph, rows) for ph in PHASES}
    return all(getattr(summed[ph], f) == whole[ph][f] for ph in PHASES
               for f in ("ops", "kernel_calls", "collectives", "messages", "syncs"))


def measure_features(log=print) -> dict[str, Any]:
    """The table's `features` and `feature_checks` (see the module docstring)."""
    rows: dict[str, Any] = {}
    checks = {}
    for mode in CHECKPOINT_MODES:
        rows.update(feature_rows(mode))
        for names in preset_combinations():
            checks[f"{'+'.join(names)}|{mode}"] = {"holds": feature_sum_holds(names, mode, rows)}
    log("features done")
    return {"features": rows, "feature_checks": checks}


def measure_kinds(gang, log=print) -> dict[str, Any]:
    """The table's `kinds`, `lasp`, `features` and `feature_checks` (see the module
    docstring)."""
    kinds: dict[str, Any] = {"rule": law({n: count_rule(n) for n in CHUNKS}, FIT_CHUNKS)}
    for mode in CHECKPOINT_MODES:
        for kind in MLA:
            kinds[f"{kind}|{mode}"] = kind_block(kind, mode)
        kinds[f"linear|{mode}"] = law({n: kind_block("linear", mode, n) for n in CHUNKS},
                                      FIT_CHUNKS)
    log("kinds done")
    lasp = {}
    for mode in ("lasp2", "lasp1"):
        alone = gang.run(count_mixer, mode, 1, size=1)[0]
        lasp[mode] = law({d: lasp_counts(gang, mode, d, alone) for d in LASP_SIZES}, FIT_SIZES, 1)
        log(f"lasp {mode}")
    return {"kinds": kinds, "lasp": lasp, **measure_features(log)}
