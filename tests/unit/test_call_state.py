"""A built attention holds no per-call state: each call's documents and window live in that call
(its own view of the algorithm, `Algorithm.for_call`), so calls from two threads at once, or one
call's backward after another call's forward, each see their own."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

from seqpar import algorithms

N, DOCS = 12, [0, 5, 12]


def _inputs(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, N, 2, 8, generator=g, dtype=torch.float64, requires_grad=True)
            for _ in range(3)]


def _run(attn, inputs, docs) -> tuple[torch.Tensor, ...]:
    out = attn(*inputs, cu_seqlens=docs) if docs else attn(*inputs)
    grads = torch.autograd.grad(out.square().sum(), inputs)
    return (out.detach(), *grads)


def test_a_call_does_not_rewrite_the_shared_algorithm():
    attn = algorithms.build_attention("local", causal=True)
    before = attn.algo.relation
    attn(*_inputs(0), cu_seqlens=DOCS)
    assert attn.algo.relation == before and before.cu is None


def test_calls_with_other_documents_interleave_exactly():
    attn = algorithms.build_attention("local", causal=True)
    with_docs, plain = _inputs(1), _inputs(2)
    want = {"docs": _run(attn, with_docs, DOCS), "plain": _run(attn, plain, None)}
    assert not torch.equal(want["docs"][0], _run(attn, with_docs, None)[0])  # documents matter

    # forward of one call, then the other's forward and backward, then the first's backward
    out = attn(*with_docs, cu_seqlens=DOCS)
    assert all(torch.equal(a, b) for a, b in zip(_run(attn, plain, None), want["plain"],
                                                 strict=True))
    grads = torch.autograd.grad(out.square().sum(), with_docs)
    assert all(torch.equal(a, b) for a, b in zip(grads, want["docs"][1:], strict=True))

    def worker(name: str, inputs, docs) -> list[str]:
        wrong = []
        for _ in range(30):
            got = _run(attn, inputs, docs)
            if not all(torch.equal(a, b) for a, b in zip(got, want[name], strict=True)):
                wrong.append(name)
        return wrong

    with ThreadPoolExecutor(max_workers=2) as pool:  # result() raises what a thread raised
        calls = [pool.submit(worker, "docs", with_docs, DOCS),
                 pool.submit(worker, "plain", plain, None)]
        assert [call.result(timeout=120) for call in calls] == [[], []]
