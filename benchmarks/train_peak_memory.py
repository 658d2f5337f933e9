"""The memory rule on the tiny decoder (one CPU rank, `local`): the peak over the timed steps (the rule
every mode follows now: after a warm step) beside the old training rule (one metered step that was
the first when warmup was 1: AdamW's moments created inside it), the bytes of states the rank holds,
and the planner's prediction of a step's peak (`planner.predict_trial` on the `local`
cluster). On CPU a peak is the resident high-water mark above the start of its region: the timed
steps start with the states already resident, the first step does not.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/train_peak_memory.py [--seq-lens 512,1024,2048]
"""

from __future__ import annotations

import argparse
import statistics

import torch

from seqpar import planner
from seqpar.case import TrainCase
from seqpar.experiments.spec import ExperimentSpec
from seqpar.model.config import ModelConfig
from seqpar.planner import clusters
from seqpar.workers.measure import train
from seqpar.workers.measure.meters import MemoryMeter

MIB = 2**20


def old_rule(case: TrainCase) -> int:
    """The first step under the meter, as training measured it with warmup 1 before."""
    net = train.build(case, None)
    opt = torch.optim.AdamW(net.parameters(), lr=case.lr)
    meter = MemoryMeter(torch.device("cpu"))
    meter.start()
    tokens, cu = train.batch_tokens(case, 0, 0)
    net.loss(tokens, cu).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return meter.stop().peak_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-lens", default="512,1024,2048")
    parser.add_argument("--repeats", type=int, default=3, help="medians over this many runs")
    args = parser.parse_args()
    local = clusters.load("local")
    cfg = ModelConfig.preset("tiny")
    print("| N | timed steps' peak MiB | old rule (first step) MiB | states MiB | planner's peak MiB |")
    print("|---|---|---|---|---|")
    for n in (int(x) for x in args.seq_lens.split(",")):
        case = TrainCase(algorithm="local", sp=1, layout="contiguous", seq_len=n, warmup=1, iters=3)
        new = [train.train_steps(case, 0, None) for _ in range(args.repeats)]
        old = [old_rule(case) for _ in range(args.repeats)]
        spec = ExperimentSpec.parse({
            "model": {"heads": cfg.heads, "kv_heads": cfg.kv_heads, "head_dim": cfg.head_dim},
            "plan": {"algorithm": "local", "world": 1, "layout": "contiguous"},
            "workload": {"seq_len": n, "warmup": 1, "iters": 3}, "train": {"model": "tiny"}})
        predicted = planner.predict_trial(spec, local).peak_mem_bytes
        print(f"| {n} | {statistics.median(r.loop.memory.peak_bytes for r in new) / MIB:.1f} | "
              f"{statistics.median(old) / MIB:.1f} | {new[0].levers['state_bytes'] / MIB:.1f} | "
              f"{predicted / MIB:.1f} |")


if __name__ == "__main__":
    main()
