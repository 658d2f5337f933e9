"""The mask studies' sweeps (registry.STUDIES names them).

`sparse`: BurstEngine's Table 3 (§3.4), the whole model step: a mask applied on the full-attention
schedule without balance (`full`, contiguous: the same compute as full attention, what "attention
masking" costs), causal attention balanced (zigzag), a sliding window of N/32 with the block-wise
striped balance (stripe: every rank holds block/P tokens of every block), and block-sparse and
dilated masks balanced (`balanced`), each of the last three beside its unbalanced (contiguous)
run; TGS per trial, `seqpar compare --baseline` gives the speedups over the first row.

`masks`: every algorithm under each kind of mask (causal, window, documents, block-sparse,
dilated, prefix-LM, shared question) in the balanced layout: tokens/s, TFLOP/s per device, the load
imbalance and the bytes each moves.
"""

from __future__ import annotations

from typing import Any

from seqpar.experiments.sweep_bases import CPU_PLANS, Sweep, _base, gpu_plans
from seqpar.experiments.train_studies import _train_base


def sparse_rows(n: int) -> list[dict[str, Any]]:
    """Table 3's rows (and the unbalanced twins of the sparse ones) at N = n tokens."""
    block = n // 32
    sparse = {"window": f"window:{n // 32}", "block_sparse": f"block_sparse:{block}:0.25:0",
              "dilated": f"dilated:{block}:2"}
    rows = [{"workload.mask": "full", "plan.layout": "contiguous"},
            {"workload.mask": "causal", "plan.layout": "zigzag"}]
    for kind, spec in sparse.items():
        balanced = "stripe" if kind == "window" else "balanced"
        rows += [{"workload.mask": spec, "plan.layout": balanced},
                 {"workload.mask": spec, "plan.layout": "contiguous"}]
    return rows


def _sparse(preset: str) -> Sweep:
    if preset == "cpu":
        n = 2048
        return (_train_base(preset, plan={"algorithm": "burst", "world": 2},
                            workload={"seq_len": n}, train={"checkpoint": "sc++"}),
                {"point": sparse_rows(n)})
    n = 1048576  # BurstEngine Table 3: a 14B model, 1M tokens, 32 x A800
    return (_train_base(preset, model="14b", plan={"algorithm": "burst", "world": 32, "nodes": 4},
                        workload={"seq_len": n}, train={"checkpoint": "sc++"}),
            {"point": sparse_rows(n)})


def mask_kinds(n: int) -> list[str]:
    """One compact form of each kind of mask at N = n tokens."""
    return ["causal", f"window:{n // 8}", f"documents:{n // 4},{n // 2},{n - 3 * (n // 4)}",
            f"block_sparse:{n // 16}:0.25:0", f"dilated:{n // 16}:2", f"prefix_lm:{n // 4}",
            f"shared_question:{n // 4}:{n // 4},{n // 4},{n - 3 * (n // 4)}"]


def _masks(preset: str) -> Sweep:
    if preset == "cpu":
        n = 2048
        return (_base(preset, plan={"layout": "balanced"}, workload={"seq_len": n}),
                {"plan": CPU_PLANS, "workload.mask": mask_kinds(n)})
    n = 262144
    return (_base(preset, model="llama3-8b", plan={"layout": "balanced"}, workload={"seq_len": n}),
            {"plan": gpu_plans(8), "workload.mask": mask_kinds(n)})
