"""What the host issues for the runner's step, from a table counted by running the real code
(`ops_table.json`, written by `python -m seqpar.workers.measure.optable --write`; a test recounts
a sample and fails when the code and the table disagree). No torch.

    a = attention("ring", 8, layout="zigzag", mask="causal", phase="backward")
    b = block("full", "backward")        # a layer outside its attention
    m = block("none", "forward", kind="mla")              # an MLA layer's
    g = block("none", "forward", kind="linear", chunks=8) + lasp("lasp2", 8)  # a linear layer's
    q = block("none", "forward", features=layer_features(cfg, 0))  # Qwen3's: LLaMA's + QK-norm
    s = step(params=219, optimizer="foreach", states="replicated", world=8)
    host_ops = (a + b).total_ops(KERNEL_OPS["flash2"]["backward"]) * layers

What counts (the counter's rule, `workers.measure.opcount`): an aten operation that would launch a
kernel on a GPU (views, metadata and uninitialised allocations do not; a fill does); an attention
kernel call (one entry of the kernel engines: one flash-attn call) apart from the ops inside it,
which `KERNEL_OPS` charges per backend; a collective (all_to_all, all_gather, reduce_scatter,
all_reduce, broadcast) or a point-to-point send or receive of the communication layer, whatever the
backend does under it; a host wait on the device (.item(), nonzero, boolean indexing, a barrier;
the step's end is `step`'s).

How each count scales (the laws, all in the table):
- attention: per group size d, count(d) = a + b * (d - 1), derived at d = 2 and 4 and checked at
  3 and 8 (`law_holds`); exact (measured) where the table has the size. A ring issues b per ring
  step; documents: count = a + b * docs per document of a pack (measured at 2 and 4 documents);
  a window is measured at W = N / 8 (its skipped blocks depend on W / N: elsewhere approximate).
  Masks the table has no row for are counted as causal. Options other than the defaults are not
  measured: their default's count is returned (`measured` says whether a key is in the table),
  but for USP's head-parallel degree: Ulysses' count over dhp ranks plus the ring's over d / dhp.
- block: per layer outside its SP attention, constant in d and N (token-wise ops); a checkpoint
  mode's recompute is in its backward, and `attention_reruns(checkpoint)` says how many attention
  forwards a layer's backward runs again (full: 1; seq-attn: its prefix's, counted as 1). By kind
  (`BLOCK_KINDS`): LLaMA's; MLA's, without and with a query bottleneck (its latent projections
  issue more); a linear layer's gated DeltaNet, whose chunked rule grows a + b * chunks (the rank's
  tokens over `rules.linear.CHUNK`; derived at 2 and 4 chunks, checked at 3 and 8; one chunk
  measured apart), its rule's own count kept apart so that fla's launches can replace it on a GPU
  (`FLA_LAUNCHES`). A LLaMA-kind layer of another family is LLaMA's block plus what each of its
  `FEATURES` adds (`layer_features`: biases, QK-norm, the output gate, partial or no rotary,
  sandwich norms, GeGLU or gpt-oss's SwiGLU, the sinks, whose ops every algorithm's call adds
  once), each measured over LLaMA's block and over one with Gemma's (1 + w) norms (`norm_offset`
  costs per norm, and QK-norm, sandwich norms and the gate add norms); the sums give each preset's
  combination as measured whole (`feature_checks`). A linear layer runs no softmax SP call:
  `lasp(mode, d)` is what its exchange adds on the busiest rank (LASP-2: an all-gather forward, a
  reduce-scatter backward and a scan over the earlier ranks' pairs, a + b * (d - 1) derived at 3
  and 4, checked at 8; LASP-1: the state's messages; both the short convolution's halo messages;
  measured at 2 apart). A full checkpoint runs a linear layer's forward again, its exchange too
  (`linear_reruns`). MoE feed-forwards are counted as dense ones (with the dense one's features):
  their ops grow with the experts a batch reaches, not by a law.
- micro: once a micro-batch outside its layers (embedding, rotary tables, final norm, LM head and
  loss; the fused head at one tile): LLaMA's for every family (an embedding scale, Gemma's final
  norm, a second rotary table or YaRN's factor add a few ops a micro-batch, not counted).
- step: once a step: AdamW a + b * tensors (foreach: constant on the CPU; on a GPU a foreach op
  launches one kernel per chunk of tensors, not counted here), the gradient reduction (replicated:
  one all-reduce per tensor, or per bucket; zero1: a broadcast per tensor after the step; fsdp: an
  all-gather per unit forward, an all-gather and a reduce-scatter per unit backward, the root
  unit's too), the loss's all-reduce over the group, and the host wait at the step's end.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path
from typing import Any

from seqpar.rules.linear import CHUNK
from seqpar.rules.model import ModelConfig

TABLE_PATH = Path(__file__).with_name("ops_table.json")
PHASES = ("forward", "backward")
MASK_KINDS = ("causal", "full", "documents", "window")
# flash-attn's launches per call, from its API (csrc/flash_attn/flash_api.cpp, hopper/flash_api.cpp):
# FA2 forward: one kernel (split-KV adds a combine kernel only for decoding); backward: the
# dot(dO, O) preprocess, the dq accumulator's zero fill, the main kernel and the dq conversion,
# plus the sum of dk and dv over each kv group under GQA (two). FA3 backward: preprocess (with the
# dq_accum clear), main, dq postprocess, and dk/dv postprocess under GQA.
FLASH_LAUNCHES = {"flash2": {"forward": 1.0, "backward": 4.0},
                  "flash3": {"forward": 1.0, "backward": 3.0}}
# fla's chunk_gated_delta_rule (fla/ops/gated_delta_rule/chunk.py), a linear layer's rule on a GPU:
# forward the gate's chunk cumsum, k k^T, the triangular solve, w and u, the chunk states and the
# outputs; backward w and u and the states again, dv, dh, dq/dk/dw/dg, the WY adjoint, two in-place
# adds and the reverse cumsum
FLA_LAUNCHES = {"forward": 6.0, "backward": 9.0}
BLOCK_KINDS = ("llama", "mla", "mla_q", "linear")
# what a family changes over LLaMA's block, each a measured delta (`layer_features`)
FEATURES = ("qkv_bias", "o_bias", "mlp_bias", "qk_norm", "attn_gate", "partial_rotary", "nope",
            "sandwich_norms", "norm_offset", "gelu_tanh", "swiglu_oai", "sinks")


@dataclass(frozen=True)
class Issue:
    """What the host issues."""

    ops: float = 0.0           # aten operations that launch work (outside attention kernel calls)
    kernel_calls: float = 0.0  # attention kernel calls (forward or backward), charged per backend
    collectives: float = 0.0   # collectives issued (all_to_all, all_gather, all_reduce, ...)
    # collectives posted asynchronously behind one of `collectives`, nothing computed in between
    # (the gradient reduction's all-reduces, one a tensor): the first waits on the peers' compute,
    # these only on their transport (`planner.host.waits`)
    queued: float = 0.0
    messages: float = 0.0      # point-to-point sends + receives posted
    syncs: float = 0.0         # host waits on the device

    def __add__(self, other: Issue) -> Issue:
        return Issue(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def __mul__(self, k: float) -> Issue:
        return Issue(*(getattr(self, f.name) * k for f in fields(self)))

    __rmul__ = __mul__

    def total_ops(self, ops_per_kernel_call: float) -> float:
        """Operations launched, the kernel calls' own at `ops_per_kernel_call` each."""
        return self.ops + self.kernel_calls * ops_per_kernel_call


def _issue(counts: dict[str, float]) -> Issue:
    return Issue(**{f.name: float(counts.get(f.name, 0.0)) for f in fields(Issue)})


@lru_cache(maxsize=1)
def table() -> dict[str, Any]:
    """The generated table (see the module docstring)."""
    return json.loads(TABLE_PATH.read_text())


def attention_key(algorithm: str, d: int, layout: str, mask: str, docs: int = 1) -> str:
    return f"{algorithm}|{d}|{layout}|{mask}|{docs}"


def law_key(algorithm: str, layout: str, mask: str, docs: int = 1) -> str:
    return f"{algorithm}|{layout}|{mask}|{docs}"


def _kind(mask: str, docs: int) -> tuple[str, int]:
    kind = mask.split(":", 1)[0]
    if kind == "documents" and docs <= 1:
        return "causal", 1
    if kind not in MASK_KINDS:
        return "causal", 1
    return kind, docs if kind == "documents" else 1


def measured(algorithm: str, d: int, layout: str = "zigzag", mask: str = "causal",
             docs: int = 1) -> bool:
    """Whether the table holds this call as counted (not extrapolated)."""
    kind, docs = _kind(mask, docs)
    row = table()["attention"].get(attention_key(algorithm, d, _layout(layout, d), kind, docs))
    return isinstance(row, dict)


def _layout(layout: str, d: int) -> str:
    return "contiguous" if d == 1 else layout


def _counts(algorithm: str, d: int, layout: str, kind: str, docs: int, phase: str) -> dict:
    t = table()
    row = t["attention"].get(attention_key(algorithm, d, _layout(layout, d), kind, docs))
    if isinstance(row, dict):
        return row[phase]
    if d == 1:
        row = t["attention"].get(attention_key("local", 1, "contiguous", kind, docs))
        if isinstance(row, dict):
            return row[phase]
    law = t["laws"].get(law_key(algorithm, layout, kind, docs))
    if law is None:
        reason = row if isinstance(row, str) else "not in the table"
        raise KeyError(f"attention {algorithm} d={d} {layout} {kind} docs={docs}: {reason}")
    return {f: a + b * (d - 1) for f, (a, b) in law["law"][phase].items()}


def attention(algorithm: str, d: int, *, layout: str = "zigzag", mask: str = "causal",
              options: dict | None = None, docs: int = 1, phase: str = "forward") -> Issue:
    """One attention call of one layer, one micro-batch, on a group of d ranks (the busiest
    rank's count; phase 'forward' | 'backward'). `options` other than the defaults are not
    measured: the defaults' count, but for USP's dhp (see the module docstring)."""
    dhp = int((options or {}).get("dhp") or 1)
    if algorithm == "usp" and dhp > 1 and d % dhp == 0:
        # USP's head-parallel all-to-alls over dhp ranks around a ring over d / dhp: Ulysses'
        # count at dhp and the ring's at d / dhp, their one local call counted once
        call = {"layout": layout, "mask": mask, "docs": docs, "phase": phase}
        if dhp == d:
            return attention("ulysses", d, **call)
        return (attention("ulysses", dhp, **call) + attention("ring", d // dhp, **call)
                + attention("local", 1, **call) * -1.0)
    kind, docs = _kind(mask, docs)
    if kind != "documents" or docs in (2, 4):
        return _issue(_counts(algorithm, d, layout, kind, docs, phase))
    two, four = (_issue(_counts(algorithm, d, layout, kind, n, phase)) for n in (2, 4))
    return two + (four + two * -1.0) * ((docs - 2) / 2)


def attention_kernel_ops(algorithm: str, d: int, *, layout: str = "zigzag",
                         mask: str = "causal", docs: int = 1, phase: str = "forward") -> float:
    """The aten ops inside this call's kernel calls as counted on the CPU (torch-cpu-flash)."""
    kind, docs = _kind(mask, docs)
    return float(_counts(algorithm, d, layout, kind, max(docs, 1) if kind == "documents" else 1,
                         phase)["kernel_ops"])


def block(checkpoint: str = "none", phase: str = "forward", *, kind: str = "llama",
          chunks: int = 1, rule: str = "torch", features: tuple[str, ...] = ()) -> Issue:
    """One decoder block outside its SP attention (norms, projections, RoPE, SwiGLU, residuals;
    the recompute of the checkpoint mode counted in backward), of `kind` (BLOCK_KINDS): LLaMA's
    with what its `features` add (`layer_features`), MLA's (its latent projections; mla_q with a
    query bottleneck) or a linear layer's whole gated DeltaNet on `chunks` chunks of its rule
    (`chunks`), the rule's own operations the torch backend's or, `rule` 'fla', fla's launches
    (FLA_LAUNCHES)."""
    if kind == "llama":
        out = _issue(table()["blocks"][checkpoint][phase])
        return out + feature_deltas(features, checkpoint, phase) if features else out
    rows = table()["kinds"]
    if kind != "linear":
        return _issue(rows[f"{kind}|{checkpoint}"][phase])
    out = _issue(_at(rows[f"linear|{checkpoint}"], chunks, phase))
    if rule == "torch":
        return out
    if rule != "fla":
        raise KeyError(f"linear rule {rule!r}: torch or fla")
    runs = [phase] + ["forward"] * int(linear_reruns(checkpoint) if phase == "backward" else 0)
    for ph in runs:  # the torch rule's operations out, fla's launches in
        out = out + _issue(_at(rows["rule"], chunks, ph)) * -1.0 + Issue(ops=FLA_LAUNCHES[ph])
    return out


def feature_deltas(names: tuple[str, ...], checkpoint: str = "none", phase: str = "forward",
                   rows: dict | None = None) -> Issue:
    """What `names` (FEATURES) add to LLaMA's block under `checkpoint`: each one's delta over a
    block of the same norms, LLaMA's or, with norm_offset, Gemma's (whose cost is per norm);
    `rows`: the table's `features` (default) or rows being measured."""
    rows = table()["features"] if rows is None else rows
    over = "norm_offset" if "norm_offset" in names else "llama"
    out = Issue()
    for name in names:
        row = rows[f"{name}|{checkpoint}"]
        out = out + _issue(row["llama" if name == "norm_offset" else over][phase])
    return out


def layer_features(cfg: ModelConfig, layer: int) -> tuple[str, ...]:
    """The FEATURES of layer `layer` of `cfg` outside LLaMA's block (a softmax layer's; MoE
    feed-forwards as dense ones). A layer without RoPE (`nope_layers`) rotates nothing, partly
    or not."""
    nope = layer in cfg.nope_layers
    on = {"qkv_bias": cfg.qkv_bias, "o_bias": cfg.o_bias, "mlp_bias": cfg.mlp_bias,
          "qk_norm": cfg.qk_norm, "attn_gate": cfg.attn_gate, "nope": nope,
          "partial_rotary": not nope and cfg.rope.rotary_dim(cfg.head_dim) < cfg.head_dim,
          "sandwich_norms": cfg.sandwich_norms, "norm_offset": cfg.norm_offset,
          "gelu_tanh": cfg.act == "gelu_tanh", "swiglu_oai": cfg.act == "swiglu_oai",
          "sinks": cfg.sinks}
    return tuple(name for name in FEATURES if on[name])


def chunks(tokens: int) -> int:
    """Chunks of the chunked delta rule over a rank's `tokens` (at least one)."""
    return max(1, -(-tokens // CHUNK))


def linear_reruns(checkpoint: str = "none") -> float:
    """Forwards of a linear layer (its exchange included) its backward runs again: under 'full'
    one (`model.deltanet.run_block`); the other modes keep its activations."""
    return 1.0 if checkpoint == "full" else 0.0


def lasp(mode: str, d: int, phase: str = "forward") -> Issue:
    """What a linear layer's SP exchange adds on the busiest of d ranks under LASP `mode` (lasp2:
    its all-gather forward, reduce-scatter backward and scan over the earlier ranks' pairs;
    lasp1: the state's messages), with the short convolution's halo messages; none at d = 1."""
    if d <= 1:
        return Issue()
    return _issue(_at(table()["lasp"][mode], d, phase, offset=1))


def _at(row: dict, x: int, phase: str, offset: int = 0) -> dict:
    """A law's count at x: its measured point where the table has one, else a + b * (x - offset)."""
    point = row["points"].get(str(x))
    if point is not None:
        return point[phase]
    return {f: a + b * (x - offset) for f, (a, b) in row["law"][phase].items()}


def attention_reruns(checkpoint: str = "none") -> float:
    """Attention forwards a layer's backward runs again under `checkpoint` (full, seq-attn)."""
    return float(table()["blocks"][checkpoint]["attention_forwards_in_backward"])


def layer(algorithm: str, d: int, *, checkpoint: str = "none", phase: str = "forward",
          **call: Any) -> Issue:
    """One layer of one micro-batch: its block, its attention call and, in backward, the
    attention forwards its checkpoint mode re-runs. `call`: `attention`'s keywords."""
    out = block(checkpoint, phase) + attention(algorithm, d, phase=phase, **call)
    if phase == "backward":
        out = out + attention(algorithm, d, phase="forward", **call) * attention_reruns(checkpoint)
    return out


def micro(phase: str = "forward", *, fused_head: bool = False) -> Issue:
    """What a micro-batch issues outside its layers: embedding, rotary tables, final norm, head
    and loss (fused: at one tile)."""
    return _issue(table()["micro"]["fused" if fused_head else "unfused"][phase])


def optimizer(params: int, kind: str = "foreach") -> Issue:
    """AdamW's step over `params` parameter tensors ('foreach' or 'per-parameter'), zero_grad
    included."""
    law = table()["optimizer"][kind]["law"]
    return _issue({f: a + b * params for f, (a, b) in law.items()})


def reduction(params: int, *, states: str = "replicated", buckets: int | None = None,
              world: int = 1, layers: int | None = None) -> Issue:
    """The gradient reduction of a step over `world` ranks: replicated, one all-reduce per
    parameter tensor (seqpar's GradSync) or per bucket (`buckets`); zero1 the same, its broadcasts
    being `step`'s; fsdp per unit (`layers` + the root) an all-gather forward, an all-gather and a
    reduce-scatter backward, with FSDP2's copies (`layers` default: the tiny model's tensors per
    layer, 9)."""
    if world <= 1:
        return Issue()
    if states in ("replicated", "zero1"):  # posted as backward goes, waited on together
        n = float(params if buckets is None else buckets)
        return Issue(collectives=1.0, queued=n - 1.0)
    row = _states_row("fsdp", world)
    units = (params - 3) / 9 if layers is None else layers
    per = _issue(row["layer"]["forward"]) + _issue(row["layer"]["backward"])
    root = _issue(row["fixed"]["forward"]) + _issue(row["fixed"]["backward"])
    return per * units + root + Issue(collectives=-1.0)  # the loss's all-reduce is step's


def _states_row(states: str, world: int) -> dict:
    rows = table()["steps"]
    sizes = sorted(int(k.split("|")[1]) for k in rows if k.startswith(states + "|"))
    near = min(sizes, key=lambda s: abs(s - world))
    return rows[f"{states}|{near}"]


def step(params: int, *, optimizer: str = "foreach", states: str = "replicated",
         buckets: int | None = None, world: int = 1, layers: int | None = None,
         micro_batches: int = 1, fused_head: bool = False) -> Issue:
    """Once a step: AdamW over `params` tensors (ZeRO-1: the shard's update and a broadcast per
    tensor), the gradient reduction (`reduction`), the loss's all-reduce over the group, the
    micro-batches' head and loss (`micro`, forward and backward) and the host wait at its end."""
    kind = optimizer
    out = reduction(params, states=states, buckets=buckets, world=world, layers=layers)
    if states == "zero1" and world > 1:
        law = _states_row("zero1", world)["optimizer"]
        out = out + _issue({f: a + b * params for f, (a, b) in law.items()})
    else:
        out = out + globals()["optimizer"](params, kind)
    if world > 1:
        out = out + _issue(_states_row("replicated", world)["fixed"]["forward"])  # the loss's
    heads = micro("forward", fused_head=fused_head) + micro("backward", fused_head=fused_head)
    return out + heads * micro_batches + Issue(syncs=1.0)


def _kernel_ops() -> dict[str, dict[str, float]]:
    measured_ops = table()["kernels"]
    out = {"math": measured_ops["math|causal"], "torch-cpu-flash": measured_ops["torch|causal"]}
    out.update({k: dict(v) for k, v in FLASH_LAUNCHES.items()})
    return out


class _Lazy(dict):
    """KERNEL_OPS, read from the table on first use (importing this module reads no file)."""

    def _load(self) -> None:
        if not super().__len__():
            super().update(_kernel_ops())

    def __getitem__(self, key: str) -> dict[str, float]:
        self._load()
        return super().__getitem__(key)

    def __iter__(self):
        self._load()
        return super().__iter__()

    def __len__(self) -> int:
        self._load()
        return super().__len__()

    def items(self):
        self._load()
        return super().items()

    def keys(self):
        self._load()
        return super().keys()

    def get(self, key, default=None):
        self._load()
        return super().get(key, default)


# backend -> {"forward": ops per kernel call, "backward": ...}: math and torch-cpu-flash measured
# on the CPU (causal), flash2 / flash3 the launches of flash-attn's API (FLASH_LAUNCHES)
KERNEL_OPS: dict[str, dict[str, float]] = _Lazy()
