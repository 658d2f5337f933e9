"""Start-up of a model under FSDP2 on W CPU ranks: seconds to build it (parameters created on the
meta device, sharded, then each rank's rows drawn and written) and each rank's host memory.

    .venv/bin/python benchmarks/model_startup.py --size 1b --world 2 4 8
    .venv/bin/python benchmarks/model_startup.py --size 3b --world 2 4 8
    PYTHONPATH=/tmp/before .venv/bin/python benchmarks/model_startup.py --size 1b --world 2

Per rank: the build time, its resident memory's peak over the build above what it held before
(ru_maxrss, so the import of torch and the process group are not counted), and the bytes of the
parameter shards it holds. The shapes are LLaMA-3.2's 1B and 3B (an untied head: 1.5B and 3.6B
parameters), bfloat16. The whole model is never materialised on a rank when the peak stays near
the shard, far below the model.
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import seqpar
from seqpar.model import ModelConfig, Transformer

SIZES = {
    "1b": ModelConfig(vocab=128256, hidden=2048, layers=16, heads=32, kv_heads=8, ffn=8192,
                      rope_theta=500000.0),
    "3b": ModelConfig(vocab=128256, hidden=3072, layers=28, heads=24, kv_heads=8, ffn=8192,
                      rope_theta=500000.0),
}


def _rss_peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def _current_rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _rank(rank: int, world: int, port: int, size: str, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    dist.barrier()
    before = _current_rss()
    t0 = time.perf_counter()
    net = Transformer(SIZES[size], group=dist.group.WORLD, states="fsdp", dtype=torch.bfloat16,
                      seed=0)
    dist.barrier()
    seconds = time.perf_counter() - t0
    held = sum(p.to_local().numel() * p.element_size() for p in net.parameters())
    queue.put((rank, seconds, _rss_peak_bytes() - before, held))
    dist.destroy_process_group()


def run(size: str, world: int) -> list[tuple]:
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [ctx.Process(target=_rank, args=(r, world, port, size, queue)) for r in range(world)]
    for p in procs:
        p.start()
    rows = sorted(queue.get() for _ in procs)
    for p in procs:
        p.join()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="1b")
    parser.add_argument("--world", type=int, nargs="+", default=[2, 4, 8])
    args = parser.parse_args()
    cfg = SIZES[args.size]
    whole = cfg.params() * 2
    print(f"seqpar from {seqpar.__file__}; {args.size}: {cfg.params() / 1e9:.2f}B parameters, "
          f"{whole / 2**30:.2f} GiB in bf16; load {os.getloadavg()[0]:.1f}")
    print(f"{'ranks':>5} {'build s (median)':>17} {'peak RSS over build, GiB (max)':>31} "
          f"{'shard GiB':>10} {'model / ranks':>14}")
    for world in args.world:
        rows = run(args.size, world)
        print(f"{world:5d} {statistics.median(r[1] for r in rows):17.1f} "
              f"{max(r[2] for r in rows) / 2**30:31.2f} {max(r[3] for r in rows) / 2**30:10.2f} "
              f"{whole / world / 2**30:14.2f}")


if __name__ == "__main__":
    main()
