"""The ring family's hot path costs what `local`'s does: at P = 1 a ring call is the same kernel on
the same tensors, plus merges.

A ring hands its kernel K and V out of the packed K,V message (`blocks.pack_kv`); as views of it
they had twice a plain tensor's row stride, which torch's CPU flash kernel read 20-30% slower
forward on a busy host (1-5% on a quiet one). Two guards: the kernel must see K,V laid out exactly
as `local` gives them (strides: exact), and a ring call at P = 1 must cost about `local`'s CPU time
(a loose ratio of interleaved medians, so it survives a busy machine but not work per task or per
ring step creeping in).
"""

from __future__ import annotations

import statistics
import time

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from seqpar import algorithms

CPU_FLASH = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default: 0,
             torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default: 1}


class _KernelArgs(TorchDispatchMode):
    """(forward or backward, then the shape and stride of q, k, v) at every call of the CPU flash
    kernel."""

    def __init__(self):
        super().__init__()
        self.seen: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in CPU_FLASH:
            first = CPU_FLASH[func]  # the backward's first argument is dout
            self.seen.append((first, *((tuple(t.shape), t.stride())
                                       for t in args[first:first + 3])))
        return func(*args, **(kwargs or {}))


def _inputs(n, h=4, hkv=2, d=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, n, h, d, generator=g)
    k, v = (torch.randn(1, n, hkv, d, generator=g) for _ in range(2))
    return q, k, v


@pytest.mark.parametrize("name", ["ring", "double_ring", "burst", "allgather"])
def test_the_ring_family_hands_its_kernel_k_and_v_as_local_does(name):
    q, k, v = _inputs(64, hkv=4, seed=len(name))  # MHA: GQA's expansion would copy K,V anyway
    seen = {}
    for alg in ("local", name):
        attn = algorithms.build_attention(alg, causal=False, layout="contiguous")
        with _KernelArgs() as args:
            attn(q.requires_grad_(), k.requires_grad_(), v.requires_grad_()).sum().backward()
        seen[alg] = args.seen
    assert len(seen["local"]) == 2 and {call[0] for call in seen[name]} == {0, 1}
    for call in seen[name]:
        assert call == seen["local"][call[0]]


def _step_ms(attn, q, k, v, dout) -> float:
    """This thread's CPU time for one forward + backward (waiting for a core on a busy host does
    not count)."""
    x = [t.detach().requires_grad_() for t in (q, k, v)]
    t0 = time.thread_time()
    attn(*x).backward(dout)
    return (time.thread_time() - t0) * 1e3


def test_ring_at_one_rank_costs_about_what_local_does():
    """Causal zigzag, N = 2048, fwd + bwd, one thread, 9 interleaved rounds of thread CPU time: the
    median ratio stays under 1.25 — a loose guard against work per task or per step creeping into
    the ring's path (copies, allocating merges); the exact guard on K,V's layout is the test
    above."""
    q, k, v = _inputs(2048, h=8, hkv=8, d=64, seed=1)
    dout = torch.randn_like(q)
    local = algorithms.build_attention("local", causal=True, layout="zigzag")
    ring = algorithms.build_attention("ring", causal=True, layout="zigzag")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _step_ms(local, q, k, v, dout), _step_ms(ring, q, k, v, dout)  # warm
        ratios = [_step_ms(ring, q, k, v, dout) / _step_ms(local, q, k, v, dout) for _ in range(9)]
    finally:
        torch.set_num_threads(threads)
    assert statistics.median(ratios) < 1.25, ratios
