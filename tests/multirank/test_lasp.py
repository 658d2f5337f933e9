"""A gated DeltaNet layer under LASP-2 and LASP-1, exact in float64 against the one-process layer
(out, the input's gradient, every parameter's gradient summed over the ranks) at P = 2, 3, 4: one
sequence, packed documents (a start on a rank boundary, inside a rank, within the convolution's
reach of a boundary), uneven lengths; every rank's bytes by op and phase equal to
`rules.linear.lasp_bytes_by_op` (the same at every length and with any documents). More value
heads than key heads throughout; a sequence longer than a chunk (64) in one case."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import yaml

from seqpar import algorithms
from seqpar.algorithms import recording
from seqpar.algorithms.base import Geometry
from seqpar.algorithms.comm import Comm, StrictOrder
from seqpar.algorithms.lasp import Lasp
from seqpar.model import Transformer
from seqpar.model.deltanet import DeltaNet
from seqpar.rules import layouts
from seqpar.rules.linear import LinearShape, lasp_bytes, lasp_bytes_by_op
from seqpar.rules.model import ModelConfig, layer_shapes
from seqpar.rules.rope import Rope
from seqpar.rules.shape import PHASES, TOLERANCE, AttnShape
from seqpar.workers import step_check

B = 2
CFG = ModelConfig(vocab=32, hidden=16, layers=1, heads=2, kv_heads=2, ffn=16,
                  layer_types=("linear",), lin_k_heads=2, lin_v_heads=4, lin_k_dim=4,
                  lin_v_dim=3, conv_kernel=4, norm_eps=1e-6)
NAMES = [n for n in layer_shapes(CFG, 0) if n.startswith("lin_")]


def cases(world: int) -> list[tuple[int, tuple[int, ...] | None]]:
    """(n, cu_seqlens): one sequence; documents starting on a rank boundary, two tokens past
    one and one before one (the convolution reaches across them), inside a rank; uneven
    lengths; a long one (chunks of 64 on a rank, a document across ranks and chunks); shards
    shorter than the convolution's reach (the halo from two ranks back)."""
    s = 6
    n = s * world
    return [(n, None), (n, (0, s, s + 2, n - 1, n)), (n - 1, (0, s - 1, n - 1)),
            (n + 1, (0, n + 1)), (40 * world, (0, 70, 40 * world)),
            (2 * world + 1, (0, 3, 2 * world + 1))]  # shards shorter than the halo


def params(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in layer_shapes(CFG, 0).items():
        if not name.startswith("lin_"):
            continue
        r = torch.randn(shape, generator=g, dtype=torch.float64)
        if name == "lin_norm":
            r = 1 + 0.3 * r
        elif name == "lin_a_log":
            r = torch.rand(shape, generator=g, dtype=torch.float64).mul(2).log()
        elif len(shape) > 1:
            r = r / shape[-1] ** 0.5 if name != "lin_conv" else 0.5 * r
        else:
            r = 0.3 * r
        out[name] = r
    return out


def inputs(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed + 1)
    return (torch.randn(B, n, CFG.hidden, generator=g, dtype=torch.float64),
            torch.randn(B, n, CFG.hidden, generator=g, dtype=torch.float64))


def run_layer(mixer: DeltaNet, h: torch.Tensor, dout: torch.Tensor, p: dict, cu) -> dict:
    leaves = {n: t.clone().requires_grad_() for n, t in p.items()}
    x = h.clone().requires_grad_()
    out = mixer(x, leaves, CFG, cu_seqlens=cu)
    out.backward(dout)
    return {"out": out.detach(), "dh": x.grad, **{f"d{n}": t.grad for n, t in leaves.items()}}


def _rank(env, world: int, mode: str, seed: int) -> list[dict]:
    comm = Comm(env.group(world), order=StrictOrder.of(None))
    mixer = DeltaNet(Lasp(comm, mode))
    rows = []
    for i, (n, cu) in enumerate(cases(world)):
        h, dout = inputs(n, seed + i)
        pos = torch.tensor(layouts.positions("contiguous", env.rank, world, n, cu or (0, n)))
        with recording() as ledger:
            got = run_layer(mixer, h[:, pos], dout[:, pos], params(seed), cu)
        sent = {(e.op, e.phase): e.bytes_sent for e in ledger.entries.values()}
        rows.append({"pos": pos, "got": got, "sent": sent})
    return rows


def error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max()) / max(float(want.abs().max()), 1e-6)


# make test: LASP-2 at P = 3 and 4, LASP-1 at P = 3; every other (mode, P) is make test-full's
IN_MAKE_TEST = {("lasp2", 3), ("lasp2", 4), ("lasp1", 3)}
MODES_BY_P = [pytest.param(m, w, marks=() if (m, w) in IN_MAKE_TEST else pytest.mark.slow,
                           id=f"{m}-{w}") for m in ("lasp2", "lasp1") for w in (2, 3, 4)]


@pytest.mark.multirank
@pytest.mark.parametrize(("mode", "world"), MODES_BY_P)
def test_lasp_exact_and_bytes_as_counted(gang, seed, world, mode):
    per_rank = gang.run(_rank, world, mode, seed, size=world)
    shape = LinearShape.of(CFG, B, 8)
    failures = []
    for i, (n, cu) in enumerate(cases(world)):
        h, dout = inputs(n, seed + i)
        want = run_layer(DeltaNet(), h, dout, params(seed), cu)
        rows = [ranks[i] for ranks in per_rank]
        got = {}
        for name in ("out", "dh"):
            t = torch.zeros_like(want[name])
            for r in rows:
                t[:, r["pos"]] = r["got"][name]
            got[name] = t
        for name in want:
            if name not in got:
                got[name] = sum(r["got"][name] for r in rows)
        failures += [f"n={n} cu={cu}: {name} error {error(got[name], want[name]):.1e}"
                     for name in want if not error(got[name], want[name]) <= TOLERANCE["float64"]]
        for r, row in enumerate(rows):
            expect = {k: v for k, v in lasp_bytes_by_op(mode, shape, world, r, n).items() if v}
            if row["sent"] != expect:
                failures.append(f"n={n} cu={cu} rank {r}: bytes {row['sent']} != {expect}")
    assert not failures, "\n".join(failures)


# ------------------------------------------------------------------ the hybrid model under SP
HYBRID = ModelConfig(vocab=61, hidden=32, layers=4, heads=4, kv_heads=2, ffn=40, head_dim=8,
                     family="qwen3_next", layer_types=("linear", "linear", "linear", "full"),
                     rope=Rope(theta=10000.0, fraction=0.5), qk_norm=True, norm_offset=True,
                     attn_gate=True, norm_eps=1e-6, lin_k_heads=2, lin_v_heads=4, lin_k_dim=4,
                     lin_v_dim=4, conv_kernel=4, experts=4, experts_per_tok=2, moe_ffn=12,
                     shared_ffn=16, shared_gate=True, moe_layers=(0, 2, 3))


def model_cases(world: int) -> list[tuple[str, tuple[int, ...] | None, str]]:
    """(the full layer's algorithm, documents, checkpointing): one sequence; three documents
    (ulysses where the 4 heads split over the ranks); every block recomputed in backward (its
    communication again, booked as forward)."""
    n = 8 * world
    docs = (0, 5, n - 3, n)
    return [("ring", None, "none"), ("ulysses" if HYBRID.heads % world == 0 else "ring", docs,
                                     "none"), ("ring", docs, "full")]


@torch.no_grad()
def perturb(net) -> None:
    """Every parameter away from its start (and from 0 and 1), the same on every rank."""
    g = torch.Generator().manual_seed(7)
    for name, p in net.named_parameters():
        r = torch.randn(p.shape, generator=g, dtype=torch.float64)
        if name.endswith("lin_a_log"):
            r = torch.rand(p.shape, generator=g, dtype=torch.float64).add(0.5).log()
        elif p.dim() > 1:
            r = r / p.shape[-1] ** 0.5
        p.copy_(r * 0.3 + (1.0 if name.endswith("lin_norm") else 0.0) if p.dim() == 1 else r)


def hybrid_tokens(world: int, seed: int) -> torch.Tensor:
    return torch.randint(0, HYBRID.vocab, (B, 8 * world + 1),
                         generator=torch.Generator().manual_seed(seed))


def _model_rank(env, world: int, mode: str, seed: int) -> list[tuple]:
    out = []
    for attention, cu, checkpoint in model_cases(world):
        net = Transformer(HYBRID, attention=attention, group=env.group(world), seed=1,
                          dtype=torch.float64, linear_sp=mode, checkpoint=checkpoint)
        perturb(net)
        with recording() as ledger:
            loss = net.loss(hybrid_tokens(world, seed), cu)
            loss.backward()
        sent = {p: ledger.total(phase=p) for p in PHASES}
        out.append((loss.item(), {k: v.detach() for k, v in net.full_grads().items()}, sent))
    return out


def hybrid_bytes(attention: str, mode: str, world: int, rank: int, cu, checkpoint: str
                 ) -> dict[str, int]:
    """A rank's bytes for the whole model: the full layer's attention call, the three linear
    layers' LASP; every forward twice where backward recomputes the blocks."""
    shape = AttnShape(B, 8 * world, HYBRID.heads, HYBRID.kv_heads, HYBRID.head_dim, 8)
    geometry = Geometry.of(shape, world, "contiguous", True, cu, None)
    full = algorithms.get(attention).bytes_of_rank(shape, world, {}, rank, geometry)
    linear = lasp_bytes(mode, LinearShape.of(HYBRID, B, 8), world, rank)
    out = {p: full[p] + 3 * linear[p] for p in PHASES}
    return {**out, "forward": out["forward"] * (2 if checkpoint == "full" else 1)}


# the hybrid model in make test: LASP-2 at P = 4 and LASP-1 at P = 3 (the layer tests above run
# LASP-2 at P = 3 too); the rest make test-full's
MODEL_IN_MAKE_TEST = {("lasp2", 4), ("lasp1", 3)}


@pytest.mark.multirank
@pytest.mark.parametrize(("mode", "world"), [
    pytest.param(m, w, marks=() if (m, w) in MODEL_IN_MAKE_TEST else pytest.mark.slow,
                 id=f"{m}-{w}") for m in ("lasp2", "lasp1") for w in (2, 3, 4)])
def test_hybrid_model_under_sp_is_the_one_process_model(gang, seed, world, mode):
    """Qwen3-Next's pattern (three linear layers, a gated full-attention layer with partial
    rotary, zero-centred norms, MoE with a gated shared expert): ring or ulysses on the full
    layer, LASP on the linear ones, give the one-process loss and every gradient; bytes as
    counted."""
    per_rank = gang.run(_model_rank, world, mode, seed, size=world)
    failures = []
    for i, (attention, cu, checkpoint) in enumerate(model_cases(world)):
        ref = Transformer(HYBRID, seed=1, dtype=torch.float64)
        perturb(ref)
        loss = ref.loss(hybrid_tokens(world, seed), cu)
        loss.backward()
        for r, (got, grads, sent) in enumerate(row[i] for row in per_rank):
            if not abs(got - loss.item()) <= TOLERANCE["float64"] * abs(loss.item()):
                failures.append(f"{attention} cu={cu} rank {r}: loss {got} != {loss.item()}")
            for name, p in ref.named_parameters():
                if not error(grads[name], p.grad) <= TOLERANCE["float64"]:
                    failures.append(f"{attention} rank {r}: {name} error "
                                    f"{error(grads[name], p.grad):.1e}")
            want = hybrid_bytes(attention, mode, world, r, cu, checkpoint)
            if sent != want:
                failures.append(f"{attention} cu={cu} rank {r}: bytes {sent} != {want}")
    assert not failures, "\n".join(failures[:20])


def model_file(cfg: ModelConfig, file) -> str:
    """cfg as a model file (a step case names its model by file)."""
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    fields["rope"] = dataclasses.asdict(cfg.rope)
    file.write_text(yaml.safe_dump({k: list(v) if isinstance(v, tuple) else v
                                    for k, v in fields.items()}))
    return str(file)


@pytest.mark.multirank
@pytest.mark.parametrize(("policy", "world", "mode"), [("dynamic", 4, "lasp2"),
                                                       ("static", 3, "lasp1")])
def test_hybrid_step_of_lengths_is_the_one_process_model(gang, seed, tmp_path, policy, world,
                                                          mode):
    """A step of variable-length sequences: each sequence's linear layers run LASP on the group
    its deal gives it (the dynamic policy: groups of several sizes, a group of one alone)."""
    from seqpar.experiments.steps import make_case

    # the deal by the costs of the same model with full layers (the planner prices no linear
    # layer yet), then the hybrid trained on it
    full = dataclasses.replace(HYBRID, layer_types=("full",) * HYBRID.layers, attn_gate=False,
                               shared_gate=False)
    case = make_case("ring", world, f"lognormal:mean=9,sigma=1.0,min=4,max={6 * world}",
                     tokens=20 * world, capacity=6, policy=policy, seed=seed % 1000,
                     model=model_file(full, tmp_path / "full.yaml"), layout="contiguous",
                     longest=6 * world)
    case = dataclasses.replace(case, model=model_file(HYBRID, tmp_path / "hybrid.yaml"),
                               linear_sp=mode)
    case.validate()
    if policy == "dynamic":
        sizes = {m.size for b in case.batches for m in b.deal.micro if m.seqs}
        assert len(sizes) > 1 and max(sizes) > 1, sizes
    got = step_check.compare(case, gang.run(step_check.rank_run, case), step_check.reference(case))
    assert got.ok, f"{case.label()}: {got.failures}"
