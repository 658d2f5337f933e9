"""The planner against torchtitan's published Llama-3.1-8B context-parallel table (pytorch/torchtitan
docs/performance.md, Table 2: 8 x H100 96 GB HBM2e, FSDP over all 8 x CP 1/2/4/8, local batch 1
so 262,144 tokens a step, full activation checkpointing; published with torch.compile + Float8).

Every rate is a datasheet's or a kernel microbenchmark's (`seqpar.planner.rates`, the
`torchtitan-h100` cluster); nothing is fitted to this table. The what-if columns separate what the
remaining error is made of: the 500 W power limit (torchtitan: "the actual peak TFLOPs number is
between SXM and NVL"; the NVL's 835 of the SXM's 989 TFLOP/s scales every rate) and Float8 on the
linear layers (GEMMs at FP8's 2x the bf16 peak, the same efficiency).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/plan_torchtitan.py [--kernel sdpa-flash]
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from seqpar.planner import clusters
from seqpar.planner.policy import Filters
from seqpar.planner.search import make_setup, search
from seqpar.planner.step import PARTS

# (FSDP, CP, sequence length, TPS/GPU, memory GiB), torchtitan docs/performance.md Table 2
PUBLISHED = [(8, 1, 32768, 3890, 83.9), (4, 2, 65536, 2540, 84.2), (2, 4, 131072, 1071, 84.0),
             (1, 8, 262144, 548, 84.5)]
TOKENS = 262144
NVL_OVER_SXM = 835.0 / 989.4  # H100 NVL / SXM bf16 dense peak (datasheets)


def _what_if(c: clusters.Cluster, what_if: str) -> clusters.Cluster:
    """The cluster (its kernel's rates already set) slowed to the 500 W clock and/or with FP8
    GEMMs."""
    def scaled(table: dict[str, float], s: float) -> dict[str, float]:
        return {d: v * s for d, v in table.items()}

    if "500W" in what_if:
        c = c.model_copy(update={k: scaled(getattr(c, k), NVL_OVER_SXM) for k in (
            "attention_tflops", "attention_backward_tflops", "gemm_tflops")})
    if "fp8" in what_if:
        c = c.model_copy(update={"gemm_tflops": scaled(c.gemm_tflops, 2.0)})
    return c


def predict(dp: int, sp: int, seq_len: int, algorithm: str, kernel: str, what_if: str = ""):
    setup = make_setup(clusters.load("torchtitan-h100"), "llama3.1-8b", seq_len, TOKENS, 8, 1,
                       kernel=kernel)
    setup = replace(setup, cluster=_what_if(setup.cluster, what_if), cache={})
    f = Filters(dp=dp, sp=sp, algorithm="local" if sp == 1 else algorithm,
                layout=None if sp == 1 else "zigzag", states="dp_sp", checkpoint="full",
                fused_head=False, offload=(), tiled=False)
    (s,) = search(setup, f).ranked
    return s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernel", default="sdpa-flash")
    args = ap.parse_args()
    print(f"kernel {args.kernel}; TPS/GPU predicted / published (ratio); memory GiB predicted / "
          "published (ratio)")
    print("| FSDP, CP | N | algorithm | TPS/GPU pred | published | ratio | 500 W | + Float8 | "
          "mem GiB pred | published | ratio | step parts s (attn/attn comm/other/recomp/comm/opt)"
          " |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for dp, sp, n, tps, mem in PUBLISHED:
        for algorithm in (("local",) if sp == 1 else ("ring", "allgather")):
            s = predict(dp, sp, n, algorithm, args.kernel)
            w = predict(dp, sp, n, algorithm, args.kernel, "500W")
            wf = predict(dp, sp, n, algorithm, args.kernel, "500W+fp8")
            gib = s.peak_mem_bytes / 2**30
            parts = "/".join(f"{s.parts[k] / 1e3:.1f}" for k in PARTS)
            print(f"| {dp}, {sp} | {n // 1024}K | {algorithm} | {s.tgs:,.0f} | {tps:,} | "
                  f"{s.tgs / tps:.2f} | {w.tgs / tps:.2f} | {wf.tgs / tps:.2f} | {gib:.1f} | "
                  f"{mem} | {gib / mem:.2f} | {parts} |")


if __name__ == "__main__":
    main()
