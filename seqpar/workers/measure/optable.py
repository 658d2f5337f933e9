"""The operation table of the runner's step (`seqpar/rules/ops_table.json`), counted by running
the real code under `opcount.OpCounter`, and the laws the planner extrapolates with.

    python -m seqpar.workers.measure.optable --write     # regenerate (a few minutes, 8 gloo ranks)
    python -m seqpar.workers.measure.optable             # print the table, write nothing

What is counted, and where (`seqpar.rules.ops` reads it; docs in its docstring):
- attention: one call of every algorithm x layout x mask x group size (1, 2, 3, 4, 8) on the
  ranks of a LocalGang, forward and backward apart, the busiest rank's count of each field;
  documents at 2 and 4 equal documents (a law per document), a window of N/8 keys.
- block: one decoder layer outside its attention, per checkpoint mode (the difference of a 2-layer
  and a 1-layer model), and what a micro-batch adds outside its layers (embedding, final norm,
  head and loss), unfused and fused head.
- kinds, lasp and features (`optable_kinds`): an MLA layer's block and a linear layer's (its law
  in the delta rule's chunks, the rule's own share apart), per checkpoint mode; what LASP-2 and
  LASP-1 add to a linear layer per group size (2, 3, 4, 8; a law in d); what each family feature
  (`rules.ops.FEATURES`: QK-norm, biases, Gemma's norms, ...) adds to LLaMA's block per checkpoint
  mode, over LLaMA's norms and Gemma's, and each preset's combination measured whole against the
  sum (feature_checks).
- optimizer: AdamW's step over a model's parameter tensors, foreach and per parameter (a law per
  tensor); ZeRO-1's; the gradient reduction of replicated states (one all-reduce per tensor) and
  FSDP2's gathers and reduce-scatters (per layer and the root); the loss's all-reduce.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import torch

from seqpar import algorithms
from seqpar.errors import SeqparError
from seqpar.model import ModelConfig, Transformer
from seqpar.platform.localgang import LocalGang
from seqpar.rules import ops as rules_ops
from seqpar.rules.memory import CHECKPOINT_MODES
from seqpar.workers.measure import optable_kinds
from seqpar.workers.measure.opcount import (
    CONFIG,
    FIELDS,
    OpCounter,
    busiest,
    count_model,
    linear,
    minus,
)

N = 192          # tokens of an attention call: divides every layout's chunks at 1, 2, 3, 4 and 8 ranks
HEADS, KV_HEADS, HEAD_DIM = 48, 24, 8  # divisible by every size: ulysses runs at 3 and 8
ALGORITHMS = ("local", "allgather", "ulysses", "ring", "usp", "double_ring", "wallfacer", "burst")
LAYOUTS = ("contiguous", "zigzag", "stripe", "balanced")
MASKS = ("causal", "full", "documents", "window")
DOCS = (2, 4)
SIZES = (1, 2, 3, 4, 8)
FIT_SIZES = (2, 4)    # the linear law in d is derived from these; the others check it
SEQ = 64



# ------------------------------------------------------------------------------ one attention call
def _call_args(mask: str, docs: int, n: int) -> tuple[dict[str, Any], tuple[int, ...] | None]:
    """(build_attention's keywords, the call's cu_seqlens) of a measured mask kind."""
    if mask == "full":
        return {"causal": False}, None
    if mask == "window":
        return {"causal": True, "window": n // 8}, None
    if mask == "documents":
        return {"causal": True}, tuple(range(0, n + 1, n // docs))
    return {"causal": True}, None


def count_attention(env, name: str, layout: str, mask: str, docs: int, options: dict,
                    n: int = N, seed: int = 0) -> dict[str, dict[str, Any]] | str:
    """One call's forward and backward counts on this rank of `env.mesh` (a gang function), or
    the rule it breaks."""
    try:
        kwargs, cu = _call_args(mask, docs, n)
        attend = algorithms.build_attention(name, layout=layout, mesh=env.mesh, **kwargs, **options)
        pos = attend.positions(n, cu)
        gen = torch.Generator().manual_seed(seed)
        q, k, v = (torch.randn(1, n, h, HEAD_DIM, generator=gen)[:, pos].requires_grad_()
                   for h in (HEADS, KV_HEADS, KV_HEADS))
        grad = torch.randn(q.shape, generator=gen)
        attend(q, k, v, cu_seqlens=cu).backward(grad)  # warm: caches, lazy set-up
        with OpCounter() as c:
            with c.phase("forward"):
                out = attend(q, k, v, cu_seqlens=cu)
            with c.phase("backward"):
                out.backward(grad)
    except SeqparError as rule:
        return str(rule)
    return {ph: c.total(ph).as_dict() for ph in ("forward", "backward")}


def mesh_key(name: str, d: int, options: dict) -> tuple:
    return (algorithms.grid_for(name, d, None, **options), tuple(algorithms.get(name).axes), None)


def attention_counts(gang, name: str, d: int, layout: str, mask: str, docs: int = 1,
                     options: dict | None = None) -> dict | str:
    """The busiest rank's counts of one call on the gang's first d ranks."""
    options = dict(options or {})
    try:
        key = mesh_key(name, d, options)
    except SeqparError as rule:
        return str(rule)
    return busiest(gang.run(count_attention, name, layout, mask, docs, options, size=d, mesh=key))


def attention_laws(rows: dict[str, Any]) -> dict[str, Any]:
    """Per algorithm, layout, mask and documents: count(d) = a + b * (d - 1) through the sizes
    FIT_SIZES, and whether it gives every other measured size (d > 1) exactly."""
    laws = {}
    for name in ALGORITHMS:
        for layout in LAYOUTS:
            for mask in MASKS:
                for docs in DOCS if mask == "documents" else (1,):
                    got = {d: rows.get(rules_ops.attention_key(name, d, layout, mask, docs))
                           for d in SIZES}
                    got = {d: r for d, r in got.items() if isinstance(r, dict)}
                    if not all(d in got for d in FIT_SIZES):
                        continue
                    (d0, d1) = FIT_SIZES
                    law, holds = {}, {}
                    for ph in ("forward", "backward"):
                        law[ph] = {}
                        for f in FIELDS:
                            b = (got[d1][ph][f] - got[d0][ph][f]) / (d1 - d0)
                            law[ph][f] = [got[d0][ph][f] - b * (d0 - 1), b]
                    for d, r in got.items():
                        if d > 1 and d not in FIT_SIZES:
                            holds[str(d)] = all(
                                math.isclose(law[ph][f][0] + law[ph][f][1] * (d - 1), r[ph][f])
                                for ph in ("forward", "backward") for f in FIELDS)
                    laws[rules_ops.law_key(name, layout, mask, docs)] = {"law": law, "law_holds": holds}
    return laws


def measure_attention(gang, log=print) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in ALGORITHMS:
        for d in (1,) if name == "local" else SIZES:
            if d > gang.world:
                continue
            for layout in ("contiguous",) if d == 1 else LAYOUTS:
                for mask in MASKS:
                    for docs in DOCS if mask == "documents" else (1,):
                        got = attention_counts(gang, name, d, layout, mask, docs)
                        out[rules_ops.attention_key(name, d, layout, mask, docs)] = got
            log(f"attention {name} d={d}")
    return out


# ------------------------------------------------------------------------------- the model's parts
def _model(layers: int, checkpoint: str = "none", fused_head: bool = False,
           attention: str = "local", **kw) -> Transformer:
    return Transformer(ModelConfig(layers=layers, **CONFIG), attention=attention,
                       checkpoint=checkpoint, fused_head=fused_head, seq_fraction=0.5, **kw)


def measure_blocks() -> dict[str, Any]:
    """Per checkpoint mode: a layer outside its attention, and the attention calls its backward
    re-runs; per head: what a micro-batch adds outside its layers."""
    tokens = torch.randint(0, CONFIG["vocab"], (1, SEQ + 1), generator=torch.Generator().manual_seed(0))
    blocks, micro = {}, {}
    for mode in CHECKPOINT_MODES:
        one, two = (count_model(_model(L, mode), tokens) for L in (1, 2))
        blocks[mode] = {ph: minus(two[ph]["other"], one[ph]["other"]) for ph in one}
        # attention forwards a layer's backward runs again (full: the whole call; seq-attn: its prefix)
        fwd_calls, bwd_calls = (two[ph]["attention"]["kernel_calls"]
                                - one[ph]["attention"]["kernel_calls"] for ph in ("forward", "backward"))
        blocks[mode]["attention_forwards_in_backward"] = (bwd_calls - fwd_calls) / fwd_calls
        if mode == "none":
            for fused in (False, True):
                base = count_model(_model(1, fused_head=fused), tokens)
                micro["fused" if fused else "unfused"] = {
                    ph: minus(base[ph]["other"], blocks["none"][ph]) for ph in base}
    return {"blocks": blocks, "micro": micro}


def count_optimizer(layers: int, foreach: bool) -> tuple[int, dict]:
    net = _model(layers)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, foreach=foreach)
    for p in net.parameters():
        p.grad = torch.randn_like(p)
    opt.step()  # the first step creates the moments
    with OpCounter() as c:
        opt.step()
        opt.zero_grad(set_to_none=True)
    return len(list(net.parameters())), c.total("forward").as_dict()


def measure_optimizer() -> dict[str, Any]:
    """AdamW over P parameter tensors: a + b * P, from two model sizes (checked at a third)."""
    out = {}
    for kind, foreach in (("foreach", True), ("per-parameter", False)):
        points = [count_optimizer(layers, foreach) for layers in (1, 2, 4)]
        out[kind] = linear([(p, c) for p, c in points[:2]], check=[points[2]])
        out[kind]["step_counter_reads"] = out[kind]["law"].pop("syncs")
        out[kind]["law"]["syncs"] = [0.0, 0.0]  # AdamW reads its CPU step counters: no device wait
    return out


# --------------------------------------------------------------- a whole step on the gang
STATES = ("replicated", "zero1", "fsdp")
STEP_SIZES = (2, 4)
STEP_PHASES = ("forward", "backward", "optimizer")


def count_step(env, states: str, layers: int, d: int) -> dict[str, dict[str, Any]] | str:
    """A training step of the tiny model (ring, zigzag) on the gang's first d ranks under `states`:
    this rank's counts outside the attention, forward / backward / optimizer step, the second step."""
    net = _model(layers, layout="zigzag", group=env.group(d), states=states, attention="ring")
    opt = net.optimizer(1e-3)
    tokens = torch.randint(0, CONFIG["vocab"], (1, SEQ + 1), generator=torch.Generator().manual_seed(0))
    for counting in (False, True):
        with OpCounter() as c:
            with c.phase("forward"):
                loss = net.loss(tokens)
            with c.phase("backward"):
                loss.backward()
            with c.phase("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
        if counting:
            return {ph: c.tally(ph, "other").as_dict() for ph in STEP_PHASES}
    raise AssertionError


def measure_steps(gang, blocks: dict[str, Any], log=print) -> dict[str, Any]:
    """Per states and group size: what a step adds outside the layers' own block and attention
    (a layer's share, the rest), by phase; the optimizer's a + b * tensors."""
    out: dict[str, Any] = {}
    params = {L: len(list(_model(L).parameters())) for L in (1, 2)}
    one = {ph: dict(blocks["blocks"]["none"][ph]) for ph in ("forward", "backward")}
    micro = blocks["micro"]["unfused"]
    for states in STATES:
        for d in STEP_SIZES:
            got = {L: busiest_step(gang.run(count_step, states, L, d, size=d)) for L in (1, 2)}
            layer, rest = {}, {}
            for ph in STEP_PHASES:
                per = minus(got[2][ph], got[1][ph])
                base = one.get(ph, _zero())
                layer[ph] = minus(per, base)
                rest[ph] = minus(minus(got[1][ph], per), micro.get(ph, _zero()))
            opt = linear([(params[1], got[1]["optimizer"]), (params[2], got[2]["optimizer"])])
            opt["law"]["syncs"] = [0.0, 0.0]  # AdamW's reads of its CPU step counters
            out[f"{states}|{d}"] = {"layer": {ph: layer[ph] for ph in ("forward", "backward")},
                                   "fixed": {ph: rest[ph] for ph in ("forward", "backward")},
                                   "optimizer": opt["law"],
                                   "comm": {ph: got[1][ph]["comm"] for ph in STEP_PHASES}}
            log(f"step {states} d={d}")
    return out


def busiest_step(per_rank: list) -> dict[str, Any]:
    return {ph: {**{f: max(r[ph][f] for r in per_rank) for f in FIELDS},
                 "comm": per_rank[0][ph]["comm"]} for ph in STEP_PHASES}


def _zero() -> dict[str, int]:
    return dict.fromkeys(FIELDS, 0)


def measure_kernels() -> dict[str, Any]:
    """Aten operations inside one kernel call, per CPU backend and mask (a local attention)."""
    out: dict[str, Any] = {}
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, SEQ, h, HEAD_DIM, generator=gen).requires_grad_()
               for h in (HEADS, KV_HEADS, KV_HEADS))
    for backend in ("math", "torch"):
        for mask in ("causal", "full"):
            attend = algorithms.build_attention("local", causal=mask == "causal", backend=backend)
            attend(q, k, v).sum().backward()
            with OpCounter() as c:
                with c.phase("forward"):
                    o = attend(q, k, v)
                with c.phase("backward"):
                    o.backward(torch.ones_like(o))
            out[f"{backend}|{mask}"] = {ph: c.total(ph).kernel_ops / c.total(ph).kernel_calls
                                        for ph in ("forward", "backward")}
    return out


def build_table(gang, log=print) -> dict[str, Any]:
    table = {"version": 1, "shape": {"n": N, "heads": HEADS, "kv_heads": KV_HEADS,
                                      "head_dim": HEAD_DIM, "dtype": "float32",
                                      "kernel": "torch-cpu-flash"},
             "torch": torch.__version__}
    table["attention"] = measure_attention(gang, log)
    table["laws"] = attention_laws(table["attention"])
    log("attention done")
    table.update(measure_blocks())
    table["optimizer"] = measure_optimizer()
    table["kernels"] = measure_kernels()
    table["steps"] = measure_steps(gang, table, log)
    table.update(optable_kinds.measure_kinds(gang, log))
    return table


def dumps(table: dict[str, Any]) -> str:
    """The table as JSON, one row a line (a regenerated table's diff reads row by row)."""
    def rows(d: dict) -> str:
        return "{\n" + ",\n".join(f"  {json.dumps(k)}: {json.dumps(v, sort_keys=True)}"
                                  for k, v in sorted(d.items())) + "\n }"
    parts = [f" {json.dumps(k)}: " + (rows(v) if isinstance(v, dict) else json.dumps(v))
             for k, v in sorted(table.items())]
    return "{\n" + ",\n".join(parts) + "\n}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write {rules_ops.TABLE_PATH}")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    with LocalGang(8, sizes=(1, 2, 3, 4), device="cpu") as gang:
        table = build_table(gang, log=lambda m: print(m, file=sys.stderr))
    text = dumps(table)
    if args.write:
        Path(rules_ops.TABLE_PATH).write_text(text + "\n")
        print(f"wrote {rules_ops.TABLE_PATH}", file=sys.stderr)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
