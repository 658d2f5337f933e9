"""Every algorithm inside the tiny decoder at P = 4 on a LocalGang (gloo, CPU): a training step's
time, TGS and model FLOP/s per device in both conventions, the peak memory over the timed steps and
the activation bytes (rank 0's view: `workers.measure.train.TrainResult.summary`).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/train_throughput.py [--seq-lens 256,1024]
"""

from __future__ import annotations

import argparse

from seqpar.case import TrainCase
from seqpar.platform.localgang import LocalGang
from seqpar.workers.measure.train import gang_train

ALGORITHMS = [("ring", ()), ("ulysses", ()), ("allgather", ()), ("usp", (("dhp", 2),)),
              ("double_ring", (("inner_ring", 2),)), ("wallfacer", (("team_size", 2),)),
              ("burst", ())]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-lens", default="256,1024", help="comma-separated sequence lengths")
    parser.add_argument("--iters", type=int, default=3, help="timed steps per configuration")
    args = parser.parse_args()
    with LocalGang(4, sizes=(4,), device="cpu") as gang:
        for n in (int(x) for x in args.seq_lens.split(",")):
            for name, opts in ALGORITHMS:
                case = TrainCase(algorithm=name, sp=4, seq_len=n, options=opts, iters=args.iters)
                s = gang.run(gang_train, case)[0].summary
                print(f"N={n:5} {name:>12}: step {s['step_s'] * 1e3:7.1f} ms  TGS {s['tgs']:8.1f}  "
                      f"model GFLOP/s/device {s['model_flops_per_s'] / 1e9:6.2f} (mfu's count: "
                      f"attention by area, backward 2x)  peak {s['peak_mem_bytes']}  "
                      f"act {s['activation_bytes']}")


if __name__ == "__main__":
    main()
