"""The compact forms of masks: `parse` ("window:64", "block_sparse:64:0.1", "slices:...") and a
mapping `{kind: ..., ...}`, and `as_spec`, which writes any mask back as one."""


from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import numpy as np

from seqpar.errors import SeqparError, require
from seqpar.rules.masks.geometry import Mask, from_slices
from seqpar.rules.masks.kinds import (
    causal,
    dilated,
    documents,
    full,
    prefix_lm,
    random_block_sparse,
    shared_question,
    sliding_window,
)

# ------------------------------------------------------------------------------------ spec forms
SPECS = {
    "full": "full",
    "causal": "causal",
    "window": "window:W[:full]  (causal unless :full)",
    "documents": "documents:L1,L2,...[:full][:window=W]  (document lengths; causal unless :full)",
    "block_sparse": "block_sparse:BLOCK:DENSITY[:SEED][:causal]  (random blocks, diagonal kept)",
    "dilated": "dilated:BLOCK:STRIDE[:full]",
    "prefix_lm": "prefix_lm:PREFIX",
    "shared_question": "shared_question:Q:A1,A2,...",
    "slices": "slices:Q0-Q1/K0-K1/KIND;...  (any mask: its slices; KIND full | causal | "
              "inv_causal | bi_causal)",
}


def default_spec(kind: str, n: int) -> str:
    """A compact form of mask `kind` for n tokens, with sizes drawn from n (what `seqpar check
    --mask KIND` and the studies use when given a kind alone); a compact form is kept as it is."""
    if ":" in kind or kind in ("full", "causal"):
        return kind
    block = next((b for b in (n // 8, n // 4, n // 2) if b > 0 and n % b == 0), n)
    third = max(n // 3, 1)
    forms = {
        "window": f"window:{max(n // 8, 1)}",
        "documents": f"documents:{third},{n - 2 * third},{third}" if n >= 3 else f"documents:{n}",
        "block_sparse": f"block_sparse:{block}:0.3:0",
        "dilated": f"dilated:{block}:2",
        "prefix_lm": f"prefix_lm:{max(n // 4, 1)}",
        "shared_question": (f"shared_question:{max(n // 4, 1)}:"
                            + ",".join(str(a) for a in _split(n - max(n // 4, 1), 3))),
    }
    require(kind in forms, "mask", kind, f"must be one of {', '.join(['full', 'causal', *forms])} "
            "or a compact form (README: Any mask)")
    return forms[kind]


def _split(total: int, parts: int) -> list[int]:
    """total in up to `parts` positive lengths."""
    parts = max(1, min(parts, total))
    return [total // parts + (i < total % parts) for i in range(parts)]


def parse(spec: str | Mapping[str, Any] | Mask, n: int) -> Mask:
    """A mask of n tokens from its compact form (`SPECS`), a mapping {kind: ..., ...} or itself."""
    if isinstance(spec, Mask):
        require(spec.n == n, "mask.n", spec.n, f"must equal seq_len={n}")
        return spec
    if isinstance(spec, Mapping):
        return from_config(spec, n)
    require(isinstance(spec, str) and spec, "mask", spec,
            f"must be one of the forms {'; '.join(SPECS.values())}")
    return _parse(spec, n)


def as_spec(mask: Mask) -> str:
    """A compact form that parses back to exactly this mask: its own spec where it has one, else
    its slices (`SPECS['slices']`)."""
    if mask.spec and mask.spec.split(":")[0] in SPECS:
        try:
            if _parse(mask.spec, mask.n) == mask:
                return mask.spec
        except SeqparError:
            pass
    return "slices:" + ";".join(f"{s.q0}-{s.q1}/{s.k0}-{s.k1}/{s.kind}" for s in mask.slices)


@lru_cache(maxsize=256)
def _parse(spec: str, n: int) -> Mask:
    kind, *args = spec.split(":")
    if kind == "slices":
        try:
            parts = [p.split("/") for p in ":".join(args).split(";") if p]
            slices = [(*map(int, q.split("-")), *map(int, k.split("-")), *rest)
                      for q, k, *rest in parts]
        except ValueError:
            require(False, "mask", spec, f"must read {SPECS['slices']}")
        return from_slices(n, slices, spec)
    flags = {a for a in args if a in ("full", "causal")}
    args = [a for a in args if a not in ("full", "causal")]
    config: dict[str, Any] = {"kind": kind}
    try:
        if kind == "window":
            config |= {"window": int(args[0]), "causal": "full" not in flags}
        elif kind == "documents":
            config["lengths"] = [int(x) for x in args[0].split(",")]
            config |= {k: int(v) for k, v in (a.split("=") for a in args[1:])}
            config["causal"] = "full" not in flags
        elif kind == "block_sparse":
            config |= {"block": int(args[0]), "density": float(args[1]),
                       "seed": int(args[2]) if len(args) > 2 else 0, "causal": "causal" in flags}
        elif kind == "dilated":
            config |= {"block": int(args[0]), "stride": int(args[1]), "causal": "full" not in flags}
        elif kind == "prefix_lm":
            config["prefix"] = int(args[0])
        elif kind == "shared_question":
            config |= {"question": int(args[0]), "answers": [int(x) for x in args[1].split(",")]}
    except (IndexError, ValueError):
        require(False, "mask", spec, f"must read {SPECS.get(kind, kind)}")
    return from_config(config, n)


def from_config(config: Mapping[str, Any], n: int) -> Mask:
    """A mask from {kind: full | causal | window | documents | block_sparse | dilated | prefix_lm |
    shared_question, ...its constructor's arguments} for n tokens."""
    c = dict(config)
    kind = c.pop("kind", None)
    require(kind in SPECS, "mask.kind", kind, f"must be one of {', '.join(SPECS)}")
    try:
        if kind == "full":
            mask = full(n)
        elif kind == "causal":
            mask = causal(n)
        elif kind == "window":
            mask = sliding_window(n, c.pop("window"), c.pop("causal", True))
        elif kind == "documents":
            lengths = [int(x) for x in c.pop("lengths")]
            require(sum(lengths) == n, "mask.lengths", lengths, f"must add up to seq_len={n}")
            cu = np.concatenate([[0], np.cumsum(lengths)]).tolist()
            mask = documents(cu, c.pop("causal", True), c.pop("window", None))
        elif kind == "block_sparse":
            mask = random_block_sparse(n, c.pop("block"), float(c.pop("density")),
                                       c.pop("seed", 0), c.pop("causal", False))
        elif kind == "dilated":
            mask = dilated(n, c.pop("block"), c.pop("stride"), c.pop("causal", True))
        elif kind == "prefix_lm":
            mask = prefix_lm(n, c.pop("prefix"))
        else:
            mask = shared_question(c.pop("question"), c.pop("answers"))
    except KeyError as missing:
        require(False, f"mask.{missing.args[0]}", None, f"is required: {SPECS[kind]}")
    require(not c, "mask", sorted(c), f"unknown keys for kind {kind}: {SPECS[kind]}")
    require(mask.n == n, "mask.n", mask.n, f"must equal seq_len={n}")
    return mask
