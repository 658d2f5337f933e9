"""One meaning per utilisation name (`rules.flops.CONVENTIONS`), the same in the planner and the
runner: `mfu` counts the FLOPs a step really does (attention by its area, backward 2x, no
recompute), `mfu_unmasked_attention` torchtitan's count (attention as if unmasked), `hfu` the
kernels' (backward 2.5x, the recompute). The published tables say which one they use: BurstEngine's
MFU column (Tables 2, 4, 5) and LoongTrain's (Table 2) are their TGS under `mfu`'s count."""

from __future__ import annotations

import random

import pytest

from seqpar.case import TrainCase
from seqpar.rules import flops, masks
from seqpar.rules.model import load
from seqpar.workers.metrics import step_metrics

RNG = random.Random()
A800_PEAK = 312e12  # bf16 dense, the A100/A800 datasheet

# BurstEngine (004_*) 14B: (table row, tokens a sequence, TGS, the paper's MFU %)
BURST = [("T2 full", 1 << 20, 94.81, 41.58), ("T2 seq-level", 1 << 20, 108.82, 47.72),
         ("T2 sc++", 1 << 20, 117.83, 51.68), ("T4 2 nodes", 1 << 19, 223.25, 53.1),
         ("T4 4 nodes", 1 << 20, 118.36, 53.2), ("T4 8 nodes", 1 << 21, 60.49, 52.7),
         ("T5 CP1", 1 << 15, 1201.14, 47.34), ("T5 CP2", 1 << 16, 928.24, 48.85),
         ("T5 CP4", 1 << 17, 639.43, 50.55), ("T5 CP8", 1 << 18, 393.44, 51.90)]
# LoongTrain (002_*) Table 2, DS-Ulysses on 32 GPUs, 7B: (tokens, TGS, MFU)
LOONG = [(1 << 17, 629.9, 0.305), (1 << 18, 418.3, 0.341), (1 << 19, 243.1, 0.359),
         (1 << 20, 130.6, 0.365)]


def _utilisation(model: str, n: int, tgs: float) -> dict[str, float]:
    """Each convention's utilisation of a step whose TGS is given (one sequence of n tokens)."""
    return {k: v / n * tgs / A800_PEAK for k, v in flops.conventions(load(model), 1, n).items()}


def test_the_papers_mfu_columns_are_their_tgs_under_mfus_count():
    for row, n, tgs, paper in BURST:
        got = _utilisation("14b", n, tgs)
        # Table 2 to its last digit; Tables 4-5 2.4% above it on every row (a constant factor)
        assert got["mfu"] * 100 == pytest.approx(paper, rel=0.03), row
        assert got["mfu_unmasked_attention"] * 100 > 1.3 * paper, row  # not torchtitan's
    for row in BURST[:3]:
        assert _utilisation("14b", row[1], row[2])["mfu"] * 100 == pytest.approx(row[3], abs=0.01)
    for n, tgs, paper in LOONG:  # "the FLOPs for attention are halved" (LoongTrain §6.1)
        assert _utilisation("llama2-7b", n, tgs)["mfu"] == pytest.approx(paper, rel=0.06)


def test_conventions_count_what_they_say():
    cfg = load("llama3.1-8b")
    n = RNG.choice([4096, 32768, 131072])
    dense = 6 * flops.dense_params(cfg) * n
    causal = cfg.layers * 4.0 * n * n / 2 * cfg.heads * cfg.head_dim
    recomputed = RNG.uniform(1e12, 1e15)
    c = flops.conventions(cfg, 1, n, recomputed=recomputed)
    assert c["mfu"] == pytest.approx(dense + 3 * causal, rel=1e-12)  # Megatron-LM, causal halved
    assert c["mfu_unmasked_attention"] == pytest.approx(dense + 6 * causal, rel=1e-12)  # titan
    assert c["hfu"] == pytest.approx(dense + 3.5 * causal + recomputed, rel=1e-12)
    docs = masks.parse("documents:1024,3072", 4096)  # a mask by its area: each document's
    by_area = flops.conventions(cfg, 1, 4096, float(docs.area))["mfu"]
    assert by_area == pytest.approx(6 * flops.dense_params(cfg) * 4096 + 3 * cfg.layers * 4.0
                                    * docs.area * cfg.heads * cfg.head_dim, rel=1e-12)
    # the ledger's backward kernels (2.5x the forward by area) give the pairs back
    bwd = 2.5 * 4.0 * docs.area * cfg.heads * cfg.head_dim * cfg.layers * 3
    assert flops.visible_pairs(bwd, cfg, 3) == pytest.approx(docs.area, rel=1e-12)


def test_the_runner_names_each_convention_as_the_planner_does():
    case = TrainCase(algorithm="ring", sp=2, dp=2, layout="zigzag", model="tiny", seq_len=256,
                     checkpoint="full")
    row = step_metrics(case, 0.5, 1e12)
    assert set(flops.CONVENTIONS) <= set(row) and "model_flops_per_s" in row
    counts = flops.conventions(case.config(), 2, 256, recomputed=4 * flops.recomputed_flops(
        case.config(), 1, 256, 2, "full", 0.5))
    for name in flops.CONVENTIONS:
        assert row[name] == pytest.approx(counts[name] / 4 / 0.5 / 1e12, rel=1e-12)
    # the ledger's backward FLOPs of a causal step give the same mfu as the analytic count
    cfg = case.config()
    bwd = 2.5 * 4.0 * flops.causal_pairs(256) * cfg.heads * cfg.head_dim * cfg.layers * 2
    assert step_metrics(case, 0.5, 1e12, bwd)["mfu"] == pytest.approx(row["mfu"], rel=1e-12)
    assert "mfu" not in step_metrics(case, 0.5, None)  # no known peak: no utilisation
