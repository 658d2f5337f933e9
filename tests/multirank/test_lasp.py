"""A gated DeltaNet layer under LASP-2 and LASP-1, exact in float64 against the one-process layer
(out, the input's gradient, every parameter's gradient summed over the ranks) at P = 2, 3, 4: one
sequence, packed documents (a start on a rank boundary, inside a rank, within the convolution's
reach of a boundary), uneven lengths; every rank's bytes by op and phase equal to
`rules.linear.lasp_bytes_by_op` (the same at every length and with any documents). More value
heads than key heads throughout; a sequence longer than a chunk (64) in one case."""

from __future__ import annotations

import pytest
import torch

from seqpar.algorithms import recording
from seqpar.algorithms.comm import Comm, StrictOrder
from seqpar.algorithms.lasp import Lasp
from seqpar.model.deltanet import DeltaNet
from seqpar.rules import layouts
from seqpar.rules.linear import LinearShape, lasp_bytes_by_op
from seqpar.rules.model import ModelConfig, layer_shapes
from seqpar.rules.shape import TOLERANCE

B = 2
CFG = ModelConfig(vocab=32, hidden=16, layers=1, heads=2, kv_heads=2, ffn=16,
                  layer_types=("linear",), lin_k_heads=2, lin_v_heads=4, lin_k_dim=4,
                  lin_v_dim=3, conv_kernel=4, norm_eps=1e-6)
NAMES = [n for n in layer_shapes(CFG, 0) if n.startswith("lin_")]


def cases(world: int) -> list[tuple[int, tuple[int, ...] | None]]:
    """(n, cu_seqlens): one sequence; documents starting on a rank boundary, two tokens past
    one and one before one (the convolution reaches across them), inside a rank; uneven
    lengths; a long one (chunks of 64 on a rank, a document across ranks and chunks)."""
    s = 6
    n = s * world
    return [(n, None), (n, (0, s, s + 2, n - 1, n)), (n - 1, (0, s - 1, n - 1)),
            (n + 1, (0, n + 1)), (40 * world, (0, 70, 40 * world))]


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


@pytest.mark.multirank
@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("mode", ["lasp2", "lasp1"])
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
            expect = {k: v for k, v in lasp_bytes_by_op(mode, shape, world, r).items() if v}
            if row["sent"] != expect:
                failures.append(f"n={n} cu={cu} rank {r}: bytes {row['sent']} != {expect}")
    assert not failures, "\n".join(failures)
