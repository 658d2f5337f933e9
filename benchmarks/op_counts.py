"""aten operations a step issues, per algorithm and for the tiny decoder, counted by running the code
on local gloo ranks (float64), with the step time and a bit-for-bit record of outputs and grads.

    .venv/bin/python benchmarks/op_counts.py --save /tmp/after.pt          # count, time, record
    PYTHONPATH=/tmp/before .venv/bin/python benchmarks/op_counts.py --save /tmp/before.pt
    .venv/bin/python benchmarks/op_counts.py --compare /tmp/before.pt /tmp/after.pt

The counter is a `TorchDispatchMode` on rank 0 that counts every aten operation reaching the
dispatcher except views and metadata (`func.is_view`, `NO_LAUNCH`: what launches no kernel on a
GPU); torch.distributed's own operations (c10d) are counted apart as `comm`. One attention layer is
one call of the algorithm on (1, N/P, H, D) shards, forward then backward (`--heads 8
--kv-heads 2`: GQA); the model row is the tiny decoder's whole training step (loss, backward,
AdamW step: the optimizer's ops are its own column). This is a quick counter for before/after
tables; the runner's official count is `workers/measure/opcount.py` and `rules/ops.py`.

`--compare A B` prints the two runs side by side and checks every recorded output and gradient
with `torch.equal` (fixed seeds, float64): "bit-for-bit: yes" means every tensor is identical.
Step times are the median of `--repeats` (per-call wall, rank 0); this 2-core host is noisy, so
compare medians from runs made back to back.
"""

from __future__ import annotations

import argparse
import io
import os
import socket
import statistics
import sys
import time
from collections import Counter

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils._python_dispatch import TorchDispatchMode

NO_LAUNCH = {"_unsafe_view", "detach", "lift_fresh", "empty", "empty_like", "empty_strided",
             "new_empty", "new_empty_strided", "resize_", "set_", "_reshape_alias", "sym_size",
             "sym_stride", "sym_numel", "sym_storage_offset", "is_same_size",
             "_has_compatible_shallow_copy_type"}

# (name, world) -> options: every registered algorithm at P = 2 and 4 (local at 1)
ALGORITHMS = {
    "local": ((1, {}),),
    "allgather": ((2, {}), (4, {})),
    "ulysses": ((2, {}), (4, {})),
    "ring": ((2, {}), (4, {})),
    "usp": ((2, {"dhp": 2}), (4, {"dhp": 2})),
    "double_ring": ((2, {}), (4, {"inner_ring": 2})),
    "wallfacer": ((2, {}), (4, {})),
    "burst": ((2, {}), (4, {})),
}


class Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter = Counter()
        self.comm = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if func.namespace == "c10d":
            self.comm += 1
        elif not func.is_view and name not in NO_LAUNCH:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


def _timed(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        dist.barrier() if dist.is_initialized() else None
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def _attention_row(name, options, args, rank, world):
    from seqpar.algorithms import build_attention, layouts

    attend = build_attention(name, causal=True, layout=args.layout,
                             group=dist.group.WORLD if world > 1 else None, **options)
    g = torch.Generator().manual_seed(1234)
    n, h, hkv, d = args.seq_len, args.heads, args.kv_heads, args.head_dim
    full = [torch.randn(1, n, hh, d, generator=g, dtype=torch.float64) for hh in (h, hkv, hkv)]
    dfull = torch.randn(1, n, h, d, generator=g, dtype=torch.float64)
    shard = [layouts.shard(t, args.layout, rank, world) for t in full]
    dout = layouts.shard(dfull, args.layout, rank, world)

    def step(counter=None):
        q, k, v = (t.clone().requires_grad_() for t in shard)
        fwd = bwd = Counter()
        if counter is not None:
            with counter[0]:
                out = attend(q, k, v)
            with counter[1]:
                out.backward(dout)
            fwd, bwd = counter[0].ops, counter[1].ops
        else:
            out = attend(q, k, v)
            out.backward(dout)
        return out.detach(), q.grad, k.grad, v.grad, fwd, bwd

    step()  # plans and caches built once, as in a run
    counters = (Count(), Count())
    *tensors, fwd, bwd = step(counters)
    ms = _timed(step, args.repeats)
    return {"forward": dict(fwd), "backward": dict(bwd), "comm": counters[0].comm + counters[1].comm,
            "ms": ms, "tensors": tensors}


def _model_row(name, options, args, rank, world):
    from seqpar.model import MODELS, Transformer

    net = Transformer(MODELS["tiny"], attention=name, layout=args.layout,
                      group=dist.group.WORLD if world > 1 else None, seed=0,
                      dtype=torch.float64, **options)
    opt = net.optimizer(lr=1e-3)
    g = torch.Generator().manual_seed(99)
    tokens = torch.randint(0, MODELS["tiny"].vocab, (1, args.model_seq_len + 1), generator=g)
    counters = (Count(), Count(), Count())

    def step(counted=False):
        opt.zero_grad(set_to_none=True)
        c = counters if counted else (None, None, None)
        with c[0] or _null():
            loss = net.loss(tokens)
        with c[1] or _null():
            loss.backward()
        with c[2] or _null():
            opt.step()
        return loss.detach()

    step()
    loss = step(counted=True)
    grads = [p.grad.clone() for p in net.parameters()]
    params = [p.detach().clone() for p in net.parameters()]
    ms = _timed(step, args.repeats)
    return {"forward": dict(counters[0].ops), "backward": dict(counters[1].ops),
            "optimizer": dict(counters[2].ops),
            "comm": sum(c.comm for c in counters), "ms": ms, "tensors": [loss, *grads, *params]}


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _worker(rank, world, port, args, jobs, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        for kind, name, options in jobs:
            fn = _attention_row if kind == "attention" else _model_row
            row = fn(name, options, args, rank, world)
            if rank == 0:  # as bytes: a shared tensor would die with this process
                buf = io.BytesIO()
                torch.save(row, buf)
                queue.put((kind, name, world, buf.getvalue()))
    finally:
        if world > 1:
            dist.destroy_process_group()
        if rank == 0:
            queue.put(None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def collect(args) -> dict:
    by_world: dict[int, list] = {}
    for name, runs in ALGORITHMS.items():
        if args.algorithms and name not in args.algorithms:
            continue
        for world, options in runs:
            by_world.setdefault(world, []).append(("attention", name, options))
    if not args.no_model:
        for name, world, options in (("local", 1, {}), ("ring", 2, {}), ("ulysses", 2, {}),
                                     ("ring", 4, {})):
            if not args.algorithms or name in args.algorithms:
                by_world.setdefault(world, []).append(("model", name, options))
    ctx = mp.get_context("spawn")
    rows = {}
    for world, jobs in sorted(by_world.items()):
        queue = ctx.Queue()
        procs = [ctx.Process(target=_worker, args=(r, world, _free_port_once(world), args, jobs,
                                                   queue)) for r in range(world)]
        for p in procs:
            p.start()
        while (item := queue.get()) is not None:
            kind, name, w, raw = item
            rows[f"{kind}:{name}:P{w}"] = torch.load(io.BytesIO(raw), weights_only=False)
        for p in procs:
            p.join()
    return rows


_PORTS: dict[int, int] = {}


def _free_port_once(world: int) -> int:
    return _PORTS.setdefault(world, _free_port())


def _total(d: dict) -> int:
    return sum(d.values())


def show(rows: dict) -> None:
    print(f"{'row':28} {'fwd':>6} {'bwd':>6} {'opt':>6} {'comm':>5} {'ms':>8}")
    for key, r in rows.items():
        opt = _total(r.get("optimizer", {})) if "optimizer" in r else ""
        print(f"{key:28} {_total(r['forward']):>6} {_total(r['backward']):>6} {opt!s:>6} "
              f"{r['comm']:>5} {r['ms']:>8.2f}")


def compare(a: dict, b: dict, detail: bool) -> None:
    print(f"{'row':28} {'fwd':>11} {'bwd':>11} {'opt':>9} {'ms before/after':>17}  bit-for-bit")
    same_all = True
    for key in a:
        if key not in b:
            continue
        ra, rb = a[key], b[key]
        same = len(ra["tensors"]) == len(rb["tensors"]) and all(
            torch.equal(x, y) for x, y in zip(ra["tensors"], rb["tensors"], strict=True))
        same_all &= same
        opt = (f"{_total(ra['optimizer'])}->{_total(rb['optimizer'])}" if "optimizer" in ra
               else "")
        print(f"{key:28} {_total(ra['forward']):>5}->{_total(rb['forward']):<5}"
              f"{_total(ra['backward']):>5}->{_total(rb['backward']):<5} {opt:>9} "
              f"{ra['ms']:>8.2f}/{rb['ms']:<8.2f}  {'yes' if same else 'NO'}")
        if detail:
            for phase in ("forward", "backward"):
                ops = set(ra[phase]) | set(rb[phase])
                moved = {o: (ra[phase].get(o, 0), rb[phase].get(o, 0)) for o in sorted(ops)
                         if ra[phase].get(o, 0) != rb[phase].get(o, 0)}
                if moved:
                    print(f"    {phase}: " + ", ".join(f"{o} {x}->{y}"
                                                      for o, (x, y) in moved.items()))
    print(f"bit-for-bit over every row: {'yes' if same_all else 'NO'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--model-seq-len", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--layout", default="zigzag")
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--algorithms", nargs="*", default=None)
    parser.add_argument("--no-model", action="store_true")
    parser.add_argument("--save", default=None, help="write the rows (counts, times, tensors) here")
    parser.add_argument("--compare", nargs=2, default=None, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--detail", action="store_true", help="with --compare: ops that moved")
    parser.add_argument("--by-op", action="store_true", help="each row's ops by name")
    args = parser.parse_args()
    if args.compare:
        compare(*(torch.load(p, weights_only=False) for p in args.compare), args.detail)
        return
    rows = collect(args)
    show(rows)
    if args.by_op:
        for key, r in rows.items():
            for phase in ("forward", "backward"):
                print(f"{key} {phase}: " + ", ".join(
                    f"{o} {c}" for o, c in sorted(r[phase].items(), key=lambda x: -x[1])))
    if args.save:
        torch.save(rows, args.save)
        print(f"saved {args.save}", file=sys.stderr)


if __name__ == "__main__":
    main()
