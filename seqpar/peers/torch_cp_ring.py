"""`peer:torch-cp-ring`: torch's context-parallel ring attention
(torch.distributed.tensor.experimental, `_templated_ring_attention` and its backward), with either
of its K,V rotate methods (option `rotate`: `allgather`, torch's default, or `alltoall`).

On CUDA the adapter calls the ring SDPA handlers that `context_parallel` dispatches
scaled_dot_product_attention to (flash, or memory-efficient where flash does not take the dtype). On
CPU torch has no such handler (context_parallel dispatches CUDA kernels only), so it calls the
templated ring itself with the CPU flash kernel (`_scaled_dot_product_flash_attention_for_cpu`), the
kernel seqpar's `torch` backend runs on CPU. torch's options are process globals; the adapter sets
them around each forward and backward and restores them:

- `enable_load_balance` for the zigzag layout (torch's head-tail load balancer deals rank r the
  chunks r and 2P-1-r of 2P, seqpar's zigzag), off for contiguous;
- `rotate_method` from the option `rotate` (gradients always rotate by all-to-all, as in torch);
- `convert_to_f32` from `grad_dtype`: 'accumulate' merges and accumulates in float32 (torch's
  default) except for float64 inputs, which stay in float64 ('input': never converted).

GQA as the kernel takes it (CPU flash and CUDA flash: yes; the CUDA memory-efficient kernel,
float32: no), checked when called. Its options, rules and bytes: `seqpar.rules.peers.TorchCpRingRules`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed._functional_collectives as ft_c

from seqpar.algorithms import kernels
from seqpar.algorithms.comm import Comm
from seqpar.errors import require
from seqpar.peers.adapter import Peer
from seqpar.peers.booking import Hook, nbytes
from seqpar.rules.peers import TorchCpRingRules

aten = torch.ops.aten


def allgather_sends(comm: Comm, tensor: torch.Tensor, *args: Any,
                    **kwargs: Any) -> dict[int, int]:
    """ft_c.all_gather_single: the tensor to every other rank."""
    return {i: nbytes(tensor) for i in range(comm.size) if i != comm.rank}


def permute_sends(comm: Comm, tensor: torch.Tensor, src_dst: list[int],
                  *args: Any, **kwargs: Any) -> dict[int, int]:
    """ft_c.permute_tensor: this rank's whole tensor to src_dst[rank] (nothing to itself)."""
    dst = src_dst[comm.rank]
    return {} if dst == comm.rank else {dst: nbytes(tensor)}


def _attention_module() -> Any:
    from torch.distributed.tensor.experimental._context_parallel import _attention

    return _attention


@contextlib.contextmanager
def cp_options(load_balance: bool, rotate: str, convert_to_f32: bool) -> Iterator[Any]:
    """torch's context-parallel options for the block, restored after it."""
    a = _attention_module()
    o = a._cp_options
    saved = (o.enable_load_balance, o.rotate_method, o.convert_to_f32)
    o.enable_load_balance, o.convert_to_f32 = load_balance, convert_to_f32
    o.rotate_method = a._RotateMethod.ALL_GATHER if rotate == "allgather" else \
        a._RotateMethod.ALL_TO_ALL
    try:
        yield a
    finally:
        o.enable_load_balance, o.rotate_method, o.convert_to_f32 = saved


class TorchCpRing(TorchCpRingRules, Peer):
    def _options(self, dtype: torch.dtype) -> contextlib.AbstractContextManager[Any]:
        to_f32 = self.options.grad_dtype == "accumulate" and dtype != torch.float64
        return cp_options(self.causal and self.layout == "zigzag", self.options.rotate, to_f32)

    def hooks(self):
        return (Hook(ft_c, "all_gather_single", "all_gather", allgather_sends),
                Hook(ft_c, "permute_tensor", "all_to_all", permute_sends))

    def _mesh(self, device: torch.device) -> Any:
        from torch.distributed.device_mesh import DeviceMesh

        return DeviceMesh.from_group(self.comm.group, device.type)

    def forward(self, q, k, v):
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # torch's ring runs on (B, H, S, D)
        scale = kernels.default_scale(self.scale, q.shape[-1])
        require(not (q.is_cuda and q.dtype == torch.float64), "dtype", "float64",
                f"{self.name}: torch's CUDA attention kernels take no float64")
        require(not q.is_cuda or _flash_takes(q) or q.shape[2] == k.shape[2], "kv_heads",
                k.shape[2], f"{self.name}: torch's CUDA memory-efficient kernel (float32) takes "
                f"as many K,V heads as query heads ({q.shape[2]})")
        self.book_share(q, 1.0)
        with self._options(q.dtype) as a, self.booking():
            if q.is_cuda:
                out, lse, *rest = _cuda_forward(a, self._mesh(q.device), qt, kt, vt, self.causal,
                                                scale)
            else:
                out, lse, *rest = a._templated_ring_attention(
                    self.comm.group, 2, aten._scaled_dot_product_flash_attention_for_cpu, qt, kt,
                    vt, is_causal=self.causal, dropout_p=0.0, scale=scale)
        return out.transpose(1, 2), (qt, kt, vt, out, lse), (scale, rest)

    def backward(self, dout, saved, state):
        qt, kt, vt, out, lse = saved
        scale, rest = state
        dot = dout.transpose(1, 2)
        self.book_share(dout, 2.5)
        with self._options(qt.dtype) as a, self.booking():
            if qt.is_cuda:
                grads = _cuda_backward(a, self._mesh(qt.device), dot, qt, kt, vt, out, lse, rest,
                                       self.causal, scale)
            else:
                grads = a._templated_ring_attention_backward(
                    self.comm.group, 2, aten._scaled_dot_product_flash_attention_for_cpu_backward,
                    grad_out=dot, grad_out_name="grad_out", query=qt, key=kt, value=vt, out=out,
                    logsumexp=lse, is_causal=self.causal, dropout_p=0.0, scale=scale)
        return tuple(g.transpose(1, 2) for g in grads[:3])



def _flash_takes(q: torch.Tensor) -> bool:
    return q.dtype in (torch.float16, torch.bfloat16)


def _cuda_forward(a, mesh, qt, kt, vt, causal, scale):
    """torch's ring SDPA handler for the kernel context_parallel would dispatch to: flash for
    half precision, memory-efficient otherwise."""
    fn = (a._scaled_dot_product_ring_flash_attention if _flash_takes(qt) else
          a._scaled_dot_product_ring_efficient_attention)
    return fn(mesh, qt, kt, vt, is_causal=causal, scale=scale)


def _cuda_backward(a, mesh, dot, qt, kt, vt, out, lse, rest, causal, scale):
    """torch's ring backward handler for the kernel the forward ran (its saved extras in `rest`)."""
    if _flash_takes(qt):
        cum_q, cum_k, max_q, max_k, seed, offset = rest[:6]
        return a._scaled_dot_product_ring_flash_attention_backward(
            mesh, dot, qt, kt, vt, out, lse, cum_q, cum_k, max_q, max_k, 0.0, causal, seed,
            offset, scale=scale)
    seed, offset = rest[:2]
    return a._scaled_dot_product_ring_efficient_attention_backward(
        mesh, dot, qt, kt, vt, None, out, lse, seed, offset, 0.0, [True, True, True, False],
        causal, scale=scale)
