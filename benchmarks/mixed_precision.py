"""Mixed precision on the tiny decoder: 50 AdamW steps on the shipped text in float32, in bf16 with
fp32 master weights (and moments, and gradient reductions), and in pure bf16 (parameters and
moments in bf16). The loss of each step, the gap to float32, and how far the RMSNorm weights moved.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/mixed_precision.py [--steps 50] [--lr 1e-3]
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

from seqpar.case import TrainCase
from seqpar.experiments.spec import shipped_texts
from seqpar.workers.measure import train


def run(case: TrainCase, steps: int) -> tuple[list[float], float]:
    net = train.build(case, None)
    opt = torch.optim.AdamW(net.parameters(), lr=case.lr)
    losses = []
    for i in range(steps):
        tokens, cu = train.batch_tokens(case, i, 0)
        loss = net.loss(tokens, cu)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    norms = torch.cat([torch.cat([b.attn_norm.detach().float(), b.ffn_norm.detach().float()])
                       for b in net.blocks] + [net.norm.detach().float()])
    return losses, (norms - 1).abs().max().item()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seq-len", type=int, default=256)
    args = ap.parse_args()
    torch.set_num_threads(1)
    base = TrainCase(algorithm="local", sp=1, layout="contiguous", seq_len=args.seq_len,
                     lr=args.lr, fused_head=True, head_tiles=(64, 128),
                     text=shipped_texts()["sequence-parallelism"])
    runs = {"float32": base,
            "bf16 + fp32 master": dataclasses.replace(base, dtype="bfloat16", master_dtype="float32"),
            "pure bf16": dataclasses.replace(base, dtype="bfloat16")}
    results = {name: run(case, args.steps) for name, case in runs.items()}
    ref = results["float32"][0]
    print(f"{args.steps} steps, lr {args.lr}, N={args.seq_len}, tiny decoder, fused head")
    print("| run | loss at 1 / 10 / 25 / 50 | max abs gap to float32 | mean gap, last 10 | "
          "max norm-weight move |")
    print("|---|---|---|---|---|")
    for name, (losses, moved) in results.items():
        gaps = [abs(a - b) for a, b in zip(losses, ref, strict=True)]
        marks = " / ".join(f"{losses[i - 1]:.3f}" for i in (1, 10, 25, args.steps))
        print(f"| {name} | {marks} | {max(gaps):.4f} | {sum(gaps[-10:]) / 10:.4f} | {moved:.2e} |")


if __name__ == "__main__":
    main()
