"""The one timed pass every mode uses (`seqpar check`, the benchmark, accuracy trials): the clock
sees the kernels, not their enqueue (a device sync before each timestamp), and not a late peer (a
barrier before the first)."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from seqpar.case import Case
from seqpar.workers.measure import check
from seqpar.workers.measure.timing import timed_pass

KERNEL_S = 0.05  # how long the fake device's queued work takes


class _AsyncDevice:
    """A device whose work runs only when the host synchronises with it (as CUDA's does)."""

    def __init__(self) -> None:
        self.queue: list[float] = []

    def enqueue(self, seconds: float) -> None:
        self.queue.append(seconds)

    def synchronize(self, device=None) -> None:
        while self.queue:
            time.sleep(self.queue.pop())


def _attention_on(dev: _AsyncDevice):
    class Queued(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            dev.enqueue(KERNEL_S)  # returns at once; the kernel runs later
            return q * 1.0

        @staticmethod
        def backward(ctx, dout):
            dev.enqueue(KERNEL_S)
            return dout, torch.zeros_like(dout), torch.zeros_like(dout)

    return lambda q, k, v: Queued.apply(q, k, v)


def test_forward_and_backward_times_include_the_queued_kernels(monkeypatch):
    dev = _AsyncDevice()
    monkeypatch.setattr(torch.cuda, "synchronize", dev.synchronize)
    x = torch.randn(1, 4, 2, 8)
    fwd_s, bwd_s, (out, q, _, _) = timed_pass(_attention_on(dev), (x, x, x), torch.ones_like(x),
                                              {}, None, torch.device("cuda", 0))
    assert fwd_s >= KERNEL_S and bwd_s >= KERNEL_S  # without a sync both would be microseconds
    assert not dev.queue and torch.equal(q.grad, torch.ones_like(x))


def test_forward_only_pass_has_no_backward_time(monkeypatch):
    dev = _AsyncDevice()
    monkeypatch.setattr(torch.cuda, "synchronize", dev.synchronize)
    x = torch.randn(1, 4, 2, 8)
    fwd_s, bwd_s, (_, q, _, _) = timed_pass(_attention_on(dev), (x, x, x), None, {}, None,
                                            torch.device("cuda", 0))
    assert fwd_s >= KERNEL_S and bwd_s < KERNEL_S and q.grad is None


def _late_peer(env, delay_s: float) -> float:
    group = env.group(2)
    if env.rank == 1:
        time.sleep(delay_s)

    def attn(q, k, v):
        token = q.sum().detach().reshape(1)
        dist.all_reduce(token, group=group)  # the first collective waits for the late rank
        return q * 1.0

    x = torch.randn(1, 2, 1, 4)
    return timed_pass(attn, (x, x, x), None, {}, group, torch.device("cpu"))[0]


@pytest.mark.multirank
def test_a_late_peer_is_not_counted_in_the_forward_time(gang):
    delay_s = 1.5
    fwd_s = gang.run(_late_peer, delay_s, size=2)
    assert fwd_s[0] < delay_s / 2, fwd_s  # without the barrier rank 0's clock runs the whole delay


class _Env:
    rank, world, device, mesh = 0, 1, "cpu", None

    def group(self, size: int):
        return None


def test_check_reports_the_time_of_its_pass():
    result = check.rank_run(_Env(), Case("local", 1, seq_len=16))
    assert result.seconds > 0 and result.shards["dq"].shape == (2, 16, 4, 8)
