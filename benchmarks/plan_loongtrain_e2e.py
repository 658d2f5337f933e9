"""Validation, not calibration: the planner's whole step against LoongTrain's end-to-end Table 6
(TGS of 7B-MHA and 7B-GQA on 64 A100s, dsp = 64, with and without Selective Checkpoint++,
head-first and context-first placement, 128K-1M tokens; paper ../shared/papers/002_*, §9).

What the prediction is made of: the testbed's stated hardware (`loongtrain-a100`: A100 datasheet
peak, NVLink and 4 x HDR 200 Gb/s NICs per node), FlashAttention-2's documented efficiency (Dao
2023) for the attention kernel, the documented maximum achievable matmul rate for GEMMs, HBM
bandwidth for element-wise work and the optimizer. Nothing here is fitted to LoongTrain's tables.
Assumed where the paper is silent: 4M tokens a step (its §2 example; DP = 1, so 4-32 micro-steps),
states sharded over a node's 8 GPUs and replicated across nodes (AMSP's partial sharding, which its
hybrid ZeRO adopts, §5.1), no double ring (inner ring 1), the LM head unfused, flash2.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/plan_loongtrain_e2e.py
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from seqpar.planner import clusters
from seqpar.planner.policy import Filters
from seqpar.planner.search import make_setup, search
from seqpar.rules.model import ModelConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "unit"))
from test_perf_loongtrain import spearman  # noqa: E402

LENGTHS = (131072, 262144, 524288, 1048576)
# Table 6: per model, dcp -> 16 values: per length (SC++ HF, SC++ CF, full HF, full CF)
TABLE6 = {
    "MHA": {32: (203.9, 327.1, 158.8, 260.4, 212.0, 340.8, 163.6, 269.2, 214.2, 294.3, 164.7,
                 239.3, 169.8, 173.9, 140.8, 145.2),
            16: (363.2, 505.9, 290.4, 422.5, 386.0, 464.6, 304.7, 389.1, 318.7, 319.7, 260.0,
                 262.7, 185.7, 182.1, 149.3, 147.5),
            8: (585.6, 662.6, 486.9, 582.2, 533.5, 515.6, 443.6, 437.8, 340.1, 324.0, 277.1,
                266.8, 188.4, 186.1, 151.7, 150.2),
            4: (676.9, 675.9, 596.3, 585.0, 535.2, 519.5, 452.4, 441.1, 329.9, 323.0, 270.4,
                266.8, 185.5, 185.9, 149.3, 147.2),
            2: (661.0, 679.9, 586.7, 605.7, 516.4, 517.2, 433.6, 438.7, 321.3, 323.8, 263.2,
                267.2, 185.0, 185.0, 148.4, 145.0)},
    "GQA": {32: (585.3, 655.0, 480.6, 555.4, 514.6, 527.2, 424.0, 435.1, 333.5, 328.5, 270.0,
                 265.9, 186.4, 184.6, 149.5, 148.9),
            16: (732.1, 698.8, 637.6, 606.6, 571.6, 537.0, 473.1, 457.6, 342.4, 334.8, 277.7,
                 273.6, 189.7, 187.9, 152.1, 152.4),
            8: (779.7, 730.6, 676.0, 640.8, 588.9, 554.7, 481.3, 466.4, 349.8, 340.6, 284.3,
                279.2, 194.0, 191.6, 155.6, 154.3),
            4: (731.2, 705.1, 641.0, 636.5, 561.1, 536.1, 463.1, 458.5, 339.1, 334.2, 277.0,
                274.3, 190.1, 189.2, 152.9, 149.8),
            2: (666.4, 687.5, 589.2, 609.7, 520.3, 517.6, 428.1, 441.6, 322.8, 325.9, 264.0,
                267.3, 185.1, 185.1, 148.3, 145.0)},
}
# the paper is silent on both; its §2 example: a 4M-token global batch, AMSP's sharding choices
STATES = "node"
TOKENS = 4 * 2**20
MODELS = {"MHA": ModelConfig(32000, 4096, 32, 32, 32, 11008),
          "GQA": ModelConfig(32000, 4096, 32, 32, 8, 11008)}


def predicted(model: str, n: int, dcp: int, checkpoint: str, placement: str) -> float:
    setup = make_setup(clusters.load("loongtrain-a100"), MODELS[model], n, TOKENS or n, 64, 8)
    f = Filters(dp=1, algorithm="usp", layout="zigzag", states=STATES, checkpoint=checkpoint,
                fused_head=False, offload=(), tiled=False)
    options = [("usp", {"dhp": 64 // dcp, "dcp": dcp, "placement": placement, "inner_ring": 1})]
    (s,) = search(setup, f, attention=options).ranked
    return s.tgs


def main() -> None:
    errors, columns = [], []
    for model, rows in TABLE6.items():
        print(f"{model}: predicted / published TGS (SC++ HF, SC++ CF, full HF, full CF)")
        for i, n in enumerate(LENGTHS):
            for j, (ck, pl) in enumerate((("sc++", "head-first"), ("sc++", "context-first"),
                                          ("full", "head-first"), ("full", "context-first"))):
                pub = {dcp: v[4 * i + j] for dcp, v in rows.items()}
                pred = {dcp: predicted(model, n, dcp, ck, pl) for dcp in rows}
                errors += [pred[d] / pub[d] - 1 for d in rows]
                best_pick = max(pred, key=lambda d: pred[d])
                regret = 1 - pub[best_pick] / max(pub.values())
                columns.append((spearman(list(pred.values()), list(pub.values())), regret))
                cells = " ".join(f"{d}:{pred[d]:.0f}/{pub[d]:.0f}" for d in rows)
                print(f"  {n // 1024}K {ck} {pl}: {cells}  (pick dcp={best_pick}, regret "
                      f"{100 * regret:.1f}%)")
    print(f"{len(errors)} cells: median |error| {100 * statistics.median(map(abs, errors)):.1f}%, "
          f"median signed {100 * statistics.median(errors):+.1f}%; mean Spearman per column "
          f"{statistics.mean(c[0] for c in columns):.2f}; the pick within 5% of the best in "
          f"{sum(c[1] <= 0.05 for c in columns)} of {len(columns)} columns")


if __name__ == "__main__":
    main()
