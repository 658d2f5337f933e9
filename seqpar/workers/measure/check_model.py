"""The model check (`seqpar check --model`, tests/multirank/test_family_exactness.py): a model's
decoder under an SP algorithm against the one-process model in float64 — the loss, every gradient,
and every rank's bytes against the analytic count summed over the layers (each layer's own
relation: a sliding layer's window skips the transfers no query of its window needs).

    case = ModelCase(cfg, "ring", 4, "zigzag")                  # one sequence a row, fixed length
    got = evaluate(case, gang.run(rank_run, [case], size=4))[0]
    step = ...                                                  # a TrainCase with lengths, dealt
    got = evaluate_step(step, gang.run(rank_step, step), step_check.reference(step))

`tiny_of(cfg)` shrinks a published config (a Qwen3-8B, a gpt-oss-120b) to a model of the same
family small enough to check in float64 on two cores: every field that changes what a layer
computes kept, the dimensions cut, one period of its layer pattern kept.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from seqpar import algorithms
from seqpar.algorithms import recording
from seqpar.algorithms.base import AttnShape, Geometry
from seqpar.case import TrainCase
from seqpar.model import ModelConfig, Transformer
from seqpar.model.step import StepModel, padding, train_step
from seqpar.rules.lengths import boundaries
from seqpar.rules.linear import LinearShape, check_lasp, lasp_bytes
from seqpar.workers.measure.varlen import tokens_of
from seqpar.workers.step_check import GRAD_TOLERANCE, LOSS_TOLERANCE, on_pool
from seqpar.workers.step_check import compare as compare_steps

PHASES = ("forward", "backward")
FLOAT64_BYTES = 8


@dataclass(frozen=True)
class ModelCase:
    """One fixed-length check: `batch` rows of `seq_len` tokens through the whole model on `world`
    ranks of `algorithm` in `layout`, float64."""

    cfg: ModelConfig
    algorithm: str
    world: int
    layout: str = "zigzag"
    options: tuple[tuple[str, Any], ...] = ()
    seq_len: int = 24
    batch: int = 2
    seed: int = 0
    name: str = ""        # what the table calls the model (a family, a file)

    @property
    def shape(self) -> AttnShape:
        c = self.cfg
        return AttnShape.of_model(c, self.batch, self.seq_len, FLOAT64_BYTES)

    def validate(self) -> None:
        """The model's rules for this layout and the algorithm's for one attention layer of this
        model (ConfigError), before any rank starts."""
        model_rules(self.cfg, self.layout)
        check_lasp(self.cfg, self.layout, self.world)  # a rank's rule: LASP's layout under SP
        algorithms.check(self.algorithm, self.shape, self.world, self.layout, True,
                         **dict(self.options))

    def mesh_key(self) -> tuple:
        """The LocalGang mesh key (grid, axes, nodes) of the case's algorithm: built once a key
        on the gang, shared by every case of one algorithm, options and world."""
        grid = algorithms.grid_for(self.algorithm, self.world, **dict(self.options))
        return grid, algorithms.get(self.algorithm).axes, None

    def label(self) -> str:
        opts = "".join(f" {k}={v}" for k, v in self.options)
        return f"{self.name or 'model'} {self.algorithm}{opts} P={self.world} {self.layout}"


@dataclass
class ModelCheck:
    """A case against the one-process model: errors, and each rank's bytes by phase beside the
    analytic count."""

    case: ModelCase | TrainCase
    loss_error: float
    grad_error: float
    bytes_measured: dict[str, int]   # the busiest rank's, by phase (a step: both phases)
    bytes_expected: dict[str, int]
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


def layer_bytes(cfg: ModelConfig, algorithm: str, world: int, options: dict[str, Any],
                shape: AttnShape, layout: str, rank: int,
                cu: Sequence[int] | None = None) -> dict[str, int]:
    """Bytes `rank` sends for one forward and backward of the whole model: each layer's attention
    call under its own relation (causal, or causal in the layer's window; `cu`: packed sequences),
    net of the transfers the schedule skips."""
    spec = algorithms.get(algorithm)
    out = dict.fromkeys(PHASES, 0)
    for kind, window in zip(cfg.layer_types, cfg.window_of, strict=True):
        if kind == "linear":  # LASP's pairs and halo (rules.linear), not an attention's
            got = lasp_bytes(check_lasp(cfg, layout, world) or "lasp2",
                             LinearShape.of(cfg, shape.batch, shape.elem_bytes), world, rank,
                             shape.seq_len)
        else:
            geometry = Geometry.of(shape, world, layout, True, cu, window)
            got = spec.bytes_of_rank(shape, world, options, rank, geometry)
        for p in PHASES:
            out[p] += got[p]
    return out


@functools.lru_cache(maxsize=64)
def model_rules(cfg: ModelConfig, layout: str) -> None:
    """The decoder's own rules for `cfg` in `layout` (a layout that deals by one relation refuses
    a model whose layers have different windows), checked by building it here, on one process:
    a ConfigError before any rank starts."""
    Transformer(cfg, layout=layout, dtype=torch.float64)


@functools.lru_cache(maxsize=64)
def step_rules(cfg: ModelConfig, layout: str) -> None:
    """`model_rules`, and the step of lengths' own (`model.step.StepModel`: no load-balancing loss
    in a step of packed sequences), on one process."""
    StepModel.build(Transformer(cfg, layout=layout, dtype=torch.float64), None,
                    {1: ("local", {})}, layout)


def validate_step(case: TrainCase) -> None:
    """A step case's rules and its model's (ConfigError), before any rank starts: a rank that
    refused its model would leave the pool's other ranks waiting."""
    case.validate()
    step_rules(case.config(), case.layout)
    check_lasp(case.config(), case.layout, case.world)


def tokens_for(case: ModelCase) -> torch.Tensor:
    gen = torch.Generator().manual_seed(case.seed)
    return torch.randint(0, case.cfg.vocab, (case.batch, case.seq_len + 1), generator=gen)


def _model(case: ModelCase, **kwargs: Any) -> Transformer:
    return Transformer(case.cfg, checkpoint="none", seed=case.seed, dtype=torch.float64, **kwargs)


@functools.lru_cache(maxsize=32)
def reference(case: ModelCase) -> tuple[float, dict[str, torch.Tensor]]:
    """The one-process model's loss and gradients on the case's tokens (the algorithm aside)."""
    net = _model(case)
    loss = net.loss(tokens_for(case))
    loss.backward()
    # a weight with no gradient (DeepSeek's score bias: it picks experts, never weighs them) none
    return loss.item(), {n: p.grad.detach().clone() for n, p in net.named_parameters()
                         if p.grad is not None}


def rank_run(env: Any, cases: Sequence[ModelCase]) -> list[tuple[float, dict, dict[str, int]]]:
    """On each of the cases' ranks, on the gang's mesh of their one `mesh_key` (`run_cases`):
    (loss, every full gradient, bytes sent by phase) a case."""
    out = []
    for case in cases:
        net = _model(case, attention=case.algorithm, layout=case.layout, mesh=env.mesh,
                     **dict(case.options))
        with recording() as ledger:
            loss = net.loss(tokens_for(case))
            loss.backward()
        out.append((loss.item(), {k: v.detach().cpu() for k, v in net.full_grads().items()},
                    {p: ledger.total(phase=p) for p in PHASES}))
        del net
    return out


def run_cases(gang: Any, cases: Sequence[ModelCase]) -> list[ModelCheck]:
    """Cases of one algorithm, options and world in one gang call, each evaluated."""
    first = cases[0]
    assert all(c.mesh_key() == first.mesh_key() and c.world == first.world for c in cases)
    per_rank = gang.run(rank_run, list(cases), size=first.world, mesh=first.mesh_key())
    return [evaluate(case, [r[i] for r in per_rank]) for i, case in enumerate(cases)]


def _errors(got: tuple[float, dict[str, torch.Tensor]], want: tuple[float, dict]
            ) -> tuple[float, float, list[str]]:
    loss, grads = got
    ref_loss, ref_grads = want
    missing = sorted(set(ref_grads) - set(grads))
    grad_err = 0.0
    for name, g in grads.items():
        ref = ref_grads[name]
        scale = ref.abs().max().item() or 1.0
        grad_err = max(grad_err, (g - ref).abs().max().item() / scale)
    return abs(loss - ref_loss), grad_err, ([f"no gradient for {missing[:3]}"] if missing else [])


def evaluate(case: ModelCase, per_rank: Sequence[tuple[float, dict, dict[str, int]]]) -> ModelCheck:
    """Every rank's loss and gradients against the one-process model; its bytes against
    `layer_bytes`."""
    want = reference(case)
    loss_err = grad_err = 0.0
    failures: list[str] = []
    measured = dict.fromkeys(PHASES, 0)
    expected = dict.fromkeys(PHASES, 0)
    options = dict(case.options)
    for rank, (loss, grads, sent) in enumerate(per_rank):
        le, ge, missing = _errors((loss, grads), want)
        loss_err, grad_err = max(loss_err, le), max(grad_err, ge)
        failures += [f"rank {rank}: {m}" for m in missing]
        analytic = layer_bytes(case.cfg, case.algorithm, case.world, options, case.shape,
                               case.layout, rank)
        for p in PHASES:
            measured[p], expected[p] = max(measured[p], sent[p]), max(expected[p], analytic[p])
            if sent[p] != analytic[p]:
                failures.append(f"rank {rank} {p} bytes {sent[p]} != {analytic[p]}")
    _bounds(loss_err, grad_err, failures)
    return ModelCheck(case, loss_err, grad_err, measured, expected, failures)


def _bounds(loss_err: float, grad_err: float, failures: list[str]) -> None:
    if not loss_err <= LOSS_TOLERANCE:
        failures.append(f"loss error {loss_err:.1e} > {LOSS_TOLERANCE:g}")
    if not grad_err <= GRAD_TOLERANCE:
        failures.append(f"gradient error {grad_err:.1e} > {GRAD_TOLERANCE:g}")


# ------------------------------------------------------------------ steps of variable lengths
def rank_step(env: Any, case: TrainCase) -> list[tuple[float, dict, list]] | None:
    """Every batch's (loss, full gradients, [(group, sequences, bytes sent)] per micro-batch) on
    this gang rank (None outside the pool): the runner's own step under a ledger."""
    return on_pool(env, case, _step_with_bytes)


def _step_with_bytes(model, case: TrainCase, rank: int, device: torch.device):
    out = []
    for i, batch in enumerate(case.batches):
        with recording():
            res = train_step(model, batch.deal,
                             lambda j, i=i, b=batch: tokens_of(case, i, b.sequences[j]), rank,
                             device)
        grads = {k: v.detach().cpu() for k, v in model.net.full_grads().items()}
        out.append((res.loss, grads, [(r.group, r.seqs, r.bytes_sent) for r in res.micro]))
        model.net.zero_grad(set_to_none=True)
    return out


def micro_bytes(case: TrainCase, lengths: Sequence[int], group: tuple[int, ...],
                rank: int) -> int:
    """Bytes pool rank `rank` sends for one micro-batch of sequences of `lengths` on `group`
    (forward and backward, every layer): the pack `model.step.pack_of` makes, padding included."""
    size = len(group)
    if size <= 1 or not lengths:
        return 0
    cfg = case.config()
    n = sum(lengths)
    pad = padding(n, boundaries(list(lengths)), case.layout, size)
    cu = boundaries([*lengths, pad] if pad else list(lengths))
    shape = AttnShape.of_model(cfg, 1, n + pad, FLOAT64_BYTES)
    name, options = case.options_at(size)
    return sum(layer_bytes(cfg, name, size, options, shape, case.layout, group.index(rank),
                           cu).values())


def evaluate_step(case: TrainCase, per_rank: Sequence[Any], want: Sequence[Any]) -> ModelCheck:
    """`step_check.compare` of the losses and gradients, and every micro-batch's bytes on every
    rank against `micro_bytes`."""
    ranks = [r for r in per_rank if r is not None]
    got = compare_steps(case, [[(loss, grads) for loss, grads, _ in r] for r in ranks], want)
    failures = list(got.failures)
    measured = expected = 0
    for rank, batches in enumerate(ranks):
        sent_total = want_total = 0
        for b, (_, _, micro) in enumerate(batches):
            lengths = case.batches[b].deal.lengths
            for group, seqs, sent in micro:
                analytic = micro_bytes(case, [lengths[s] for s in seqs], group, rank)
                sent_total, want_total = sent_total + sent, want_total + analytic
                if sent != analytic:
                    failures.append(f"rank {rank} batch {b} group {group} sequences {seqs}: "
                                    f"bytes {sent} != {analytic}")
        measured, expected = max(measured, sent_total), max(expected, want_total)
    return ModelCheck(case, got.loss_error, got.grad_error, {"step": measured},
                      {"step": expected}, failures)


# ------------------------------------------------------------------ a published config, shrunk
TINY_HEADS = 12          # divisible by every P of the matrix (2, 3, 4): Ulysses splits them
TINY_HEAD_DIM = 8
TINY_VOCAB = 61
TINY_FFN = 32
TINY_WINDOW = 5          # a window shorter than a shard at P = 2..4 of 24 tokens: transfers skip
TINY_EXPERTS = 8


def tiny_of(cfg: ModelConfig, world: int = 4) -> ModelConfig:
    """A model of `cfg`'s family small enough to check in float64 here: every field that changes
    what a layer computes kept (biases, norms, QK-norm, RoPE scaling, sinks, activation, tied
    embeddings, MoE routing), the dimensions cut (12 heads, or 2P where P does not divide 12; the
    MHA/GQA kind kept; head_dim 8, free of hidden/heads where the family's is), one period of the
    layer pattern (kinds, no-RoPE and MoE layers) kept, a window of 5, at most 8 experts (top-k
    at most half of them where the family chooses among its experts)."""
    heads = TINY_HEADS if TINY_HEADS % world == 0 else 2 * world
    ratio = cfg.heads // cfg.kv_heads
    group = max((g for g in range(1, min(ratio, heads) + 1) if heads % g == 0), default=1)
    kv_heads = heads // group if ratio > 1 else heads
    free = cfg.head_dim * cfg.heads != cfg.hidden
    hidden = heads * TINY_HEAD_DIM // (2 if free else 1)
    layers = _period(cfg)
    experts = min(cfg.experts, TINY_EXPERTS)
    moe = {}
    if cfg.experts:  # top-k of fewer experts: still a choice where the family makes one
        top = (min(cfg.experts_per_tok, max(1, experts // 2))
               if cfg.experts_per_tok < cfg.experts else experts)
        moe = dict(experts=experts, experts_per_tok=top, moe_ffn=TINY_FFN // 2,
                   shared_ffn=TINY_FFN // 2 if cfg.shared_ffn else 0,
                   moe_layers=tuple(i for i in range(layers) if cfg.is_moe(i)))
    if cfg.router == "sigmoid_group":  # DeepSeek: 2 groups of the tiny experts, the best one kept
        moe.update(n_group=2, topk_group=1, experts_per_tok=min(moe["experts_per_tok"],
                                                                experts // 2))
    if cfg.mla:  # q/k 8 wide (4 of them the shared RoPE key), v 6: widths of their own
        moe.update(kv_lora_rank=16, q_lora_rank=12 if cfg.q_lora_rank else 0,
                   qk_rope_dim=TINY_HEAD_DIM // 2, v_head_dim=6)
    if "linear" in cfg.layer_types:
        moe.update(lin_k_heads=2, lin_v_heads=4, lin_k_dim=TINY_HEAD_DIM,
                   lin_v_dim=TINY_HEAD_DIM, conv_kernel=min(cfg.conv_kernel, 4))
    moe.setdefault("v_head_dim", 0)  # 0: head_dim's, unless MLA gives V its own
    return dataclasses.replace(
        cfg, vocab=min(cfg.vocab, TINY_VOCAB), hidden=hidden, layers=layers, heads=heads,
        kv_heads=kv_heads, ffn=TINY_FFN, head_dim=TINY_HEAD_DIM if free else 0,
        layer_types=cfg.layer_types[:layers], window=min(cfg.window, TINY_WINDOW),
        nope_layers=tuple(i for i in cfg.nope_layers if i < layers), **moe)


def _period(cfg: ModelConfig) -> int:
    """The fewest first layers whose pattern (kind, no-RoPE, MoE) repeats over the model, or
    that meet every kind of layer (at least 2)."""
    sig = [(cfg.layer_types[i], i in cfg.nope_layers, cfg.is_moe(i)) for i in range(cfg.layers)]
    for p in range(1, cfg.layers // 2 + 1):
        if all(sig[i] == sig[i % p] for i in range(cfg.layers)):
            return min(cfg.layers, max(2, p))
    kinds = set(sig)  # no period: the first layers that meet every kind
    return min(cfg.layers,
               max(2, next(i + 1 for i in range(cfg.layers) if set(sig[:i + 1]) == kinds)))


def overrides_of(cfg: ModelConfig, base: ModelConfig) -> tuple[tuple[str, Any], ...]:
    """The fields of `cfg` that differ from `base` (a TrainCase's model_overrides: the preset
    `base` replaced by them is `cfg`)."""
    return tuple((f.name, getattr(cfg, f.name)) for f in dataclasses.fields(cfg)
                 if getattr(cfg, f.name) != getattr(base, f.name))


def shape_line(cfg: ModelConfig) -> str:
    """The tiny model in one line (what the check table's title says)."""
    kinds = "/".join(k[0] for k in cfg.layer_types)
    parts = [f"{cfg.family}", f"{cfg.layers} layers ({kinds})", f"hidden {cfg.hidden}",
             f"heads {cfg.heads}/{cfg.kv_heads}x{cfg.head_dim}"]
    parts += [name for name, on in (("window " + str(cfg.window), "sliding" in cfg.layer_types),
                                    ("qk-norm", cfg.qk_norm), ("qkv-bias", cfg.qkv_bias),
                                    ("sinks", cfg.sinks), ("tied", cfg.tie_embeddings),
                                    (f"moe {cfg.experts}x top-{cfg.experts_per_tok}",
                                     bool(cfg.experts)),
                                    (f"rope {cfg.rope.kind}", cfg.rope.kind != "default"),
                                    (f"no-rope {list(cfg.nope_layers)}", bool(cfg.nope_layers)))
              if on]
    return ", ".join(parts)


__all__ = ["ModelCase", "ModelCheck", "evaluate", "evaluate_step", "layer_bytes", "micro_bytes",
           "model_rules", "overrides_of", "rank_run", "rank_step", "reference", "run_cases",
           "shape_line", "tiny_of", "validate_step"]
