"""seqpar's ulysses against a plain Ulysses of the kind yunchang ships (one all_to_all_single per
tensor around a reshape/transpose, torch SDPA, the reverse all-to-all as the backward): fwd+bwd step
time on P local gloo ranks, same shapes, same kernel (SDPA's CPU flash kernel). Rounds interleave,
best of each, so a busy neighbour hurts both sides alike.

    .venv/bin/python benchmarks/ulysses_overhead.py --world 2 --seq-len 4096
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from seqpar import algorithms
from seqpar.platform.localgang import LocalGang


class _SeqToHeads(torch.autograd.Function):
    """(b, s/P, h, d) sequence shard -> (b, s, h/P, d) head shard; backward is the inverse."""

    @staticmethod
    def forward(ctx, x, group, scatter, gather):
        ctx.group, ctx.dims = group, (scatter, gather)
        return _a2a(x, group, scatter, gather)

    @staticmethod
    def backward(ctx, grad):
        scatter, gather = ctx.dims
        return _a2a(grad, ctx.group, gather, scatter), None, None, None


def _a2a(x: torch.Tensor, group, scatter: int, gather: int) -> torch.Tensor:
    p = dist.get_world_size(group)
    b, s, h, d = x.shape
    if scatter == 2:  # heads out, sequence in
        send = x.reshape(b, s, p, h // p, d).permute(2, 0, 1, 3, 4).contiguous()
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=group)
        return recv.permute(1, 0, 2, 3, 4).reshape(b, p * s, h // p, d)
    send = x.reshape(b, p, s // p, h, d).permute(1, 0, 2, 3, 4).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return recv.permute(1, 2, 0, 3, 4).reshape(b, s // p, p * h, d)


def plain_ulysses(q, k, v, group):
    qh, kh, vh = (_SeqToHeads.apply(t, group, 2, 1) for t in (q, k, v))
    out = F.scaled_dot_product_attention(qh.transpose(1, 2), kh.transpose(1, 2),
                                         vh.transpose(1, 2), is_causal=True).transpose(1, 2)
    return _SeqToHeads.apply(out, group, 1, 2)


def _time(env, which: str, n: int, heads: int, dim: int, iters: int) -> float:
    torch.manual_seed(env.rank)
    group = env.group(env.world)
    s = n // env.world
    q, k, v, dout = (torch.randn(1, s, heads, dim) for _ in range(4))
    attn = (algorithms.build_attention("ulysses", causal=True, layout="contiguous", group=group)
            if which == "seqpar" else (lambda a, b, c: plain_ulysses(a, b, c, group)))
    times = []
    for i in range(iters + 1):
        qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
        dist.barrier(group=group)
        t0 = time.perf_counter()
        attn(qq, kk, vv).backward(dout)
        dist.barrier(group=group)
        if i:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    best = {"seqpar": float("inf"), "plain": float("inf")}
    with LocalGang(args.world, device="cpu") as gang:
        for _ in range(args.rounds):
            for which in best:
                t = max(gang.run(_time, which, args.seq_len, args.heads, args.head_dim, args.iters))
                best[which] = min(best[which], t)
    print(f"P={args.world} N={args.seq_len} H={args.heads} D={args.head_dim} causal fp32 fwd+bwd")
    for which, t in best.items():
        print(f"  {which:>7}: {1e3 * t:8.1f} ms")
    print(f"  seqpar / plain = {best['seqpar'] / best['plain']:.3f}")


if __name__ == "__main__":
    main()
