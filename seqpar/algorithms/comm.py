"""Instrumented communication: every byte an algorithm moves goes through a `Comm`.

Each call books its bytes in the active ledgers (see `ledger.py`) by op, group label, link class and
phase, and, when the Comm emulates links (its `links`: link class -> LinkModel, given where the Comm
is made, like its node map), completes no earlier than `latency + bytes / bandwidth` after it
started. Asynchronous exchanges stay asynchronous: `Handle.wait()` returns at the later of the real
and the emulated completion, so overlap of communication with compute shows on one machine.

Strict mode gives gloo NCCL's semantics, so a schedule that would hang on GPUs hangs (and times
out) on CPU too: tags are ignored (every message carries STRICT_TAG: two ranks' messages match in
the order posted), and a group's operations run one after the other (the previous one waited for,
as NCCL runs a communicator's in order on one stream); `ordering.py` has the rule. Like links, it
is state passed where Comms are made (a shared `StrictOrder`, or None; the mesh builders take
`strict=`, default SEQPAR_STRICT_COMM=1).

Each blocking operation is announced to an observer, if one is set (`observe.observed`): a rank's
heartbeat then says which collective the rank waits in.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from seqpar.algorithms import ledger as _ledger
from seqpar.algorithms.observe import waiting
from seqpar.algorithms.ordering import STRICT_ENV_VAR, STRICT_TAG, StrictOrder, strict_mode  # noqa: F401


@dataclass(frozen=True)
class LinkModel:
    """An emulated link: a transfer of b bytes takes at least latency_s + b / bandwidth_bytes_per_s."""

    latency_s: float = 0.0
    bandwidth_bytes_per_s: float = float("inf")

    def seconds(self, nbytes: int) -> float:
        return self.latency_s + nbytes / self.bandwidth_bytes_per_s


Links = Mapping[str, LinkModel]  # link class ('intra', 'inter') -> its emulated model
Splits = list[int] | None  # an all-to-all's rows a rank (None: equal chunks)

def _device_done(tensors: Sequence[torch.Tensor]) -> None:
    """Block until the device work on `tensors` is done (CUDA only; a CPU op is done on return)."""
    if any(t.is_cuda for t in tensors):
        torch.cuda.current_stream().synchronize()


def _elem_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class Handle:
    """Pending communication; `wait()` returns the received tensors."""

    def __init__(self, works: list, results: list[torch.Tensor], emulated_s: float, start: float,
                 group: Any = None, emulating: bool = False, order: StrictOrder | None = None,
                 label: str = ""):
        self._works, self._results, self._label = works, results, label
        self._emulated_s, self._start, self._emulating = emulated_s, start, emulating
        self._group, self._order = group, order  # strict mode: whose operation in flight this is

    def complete(self) -> None:
        """Wait for the works, once (a gloo point-to-point work waited twice blocks forever)."""
        works, self._works = self._works, []
        if works:
            with waiting(f"p2p wait on {self._label}"):
                for work in works:
                    work.wait()
        if works and self._emulating:
            _device_done(self._results)  # on CUDA, wait() only orders streams: see the transfer end
        if self._order is not None:
            self._order.done(self._group, self)

    def wait(self) -> list[torch.Tensor]:
        self.complete()
        remaining = self._start + self._emulated_s - time.perf_counter()
        if remaining > 0:
            time.sleep(remaining)
        return self._results


class Comm:
    """Communication inside one process group, booked under `label` in the ledger.

    `node_of` maps global ranks to node ids (None: one node): it classifies every transfer as
    intra- or inter-node, for the ledger and for link emulation. `links` (empty: none) emulates the
    link classes it names. `order` (None: gloo's own) gives it NCCL's semantics, shared with the
    other Comms of its mesh. All three come from the trial's mesh.
    """

    def __init__(self, group: dist.ProcessGroup | None = None, label: str = "sp",
                 node_of: dict[int, int] | None = None, links: Links | None = None,
                 order: StrictOrder | None = None):
        self.label, self.node_of, self.order = label, node_of, order
        self.links: dict[str, LinkModel] = dict(links or {})
        if group is None and not (dist.is_available() and dist.is_initialized()):
            # a single process without torch.distributed: a group of one that never communicates
            self.group, self.size, self.rank, self.global_ranks, self._nccl = None, 1, 0, [0], False
            return
        self.group = group if group is not None else dist.group.WORLD
        self.size = dist.get_world_size(self.group)
        self.rank = dist.get_rank(self.group)
        self.global_ranks = [dist.get_global_rank(self.group, i) for i in range(self.size)]
        self._nccl = dist.get_backend(self.group) == "nccl"

    @classmethod
    def solo(cls, label: str = "sp", global_rank: int = 0,
             node_of: dict[int, int] | None = None, links: Links | None = None,
             order: StrictOrder | None = None) -> Comm:
        """A group of one (this rank alone): every operation is local, nothing is booked."""
        comm = cls.__new__(cls)
        comm.label, comm.group, comm.size, comm.rank = label, None, 1, 0
        comm.global_ranks, comm._nccl, comm.node_of = [global_rank], False, node_of
        comm.order, comm.links = order, dict(links or {})
        return comm

    @property
    def strict(self) -> bool:
        """Whether this Comm follows NCCL's semantics (see the module docstring)."""
        return self.order is not None

    def relabel(self, label: str) -> Comm:
        """The same group, booked under another label."""
        comm = copy.copy(self)
        comm.label = label
        return comm

    def with_nodes(self, node_of: dict[int, int] | None) -> Comm:
        """The same group with another node map."""
        comm = copy.copy(self)
        comm.node_of = node_of
        return comm

    def with_links(self, links: Links | None) -> Comm:
        """The same group emulating `links` (None or empty: no emulation)."""
        comm = copy.copy(self)
        comm.links = dict(links or {})
        return comm

    def _clock(self, tensors: Sequence[torch.Tensor]) -> float:
        """When a transfer of `tensors` starts. Emulating on CUDA, the tensors are ready only once
        the kernels queued before them have run: without this sync the emulated clock would start
        at the CPU enqueue and the link would look faster than it is."""
        if self.links:
            _device_done(tensors)
        return time.perf_counter()

    def link(self, peer: int) -> str:
        """'intra' or 'inter': the link class between this rank and group rank `peer`."""
        return _ledger.link_class(self.global_ranks[self.rank], self.global_ranks[peer],
                                  self.node_of)

    def _group_peer(self, peer: int) -> int:
        """The rank of self.group that this Comm's rank `peer` is (the same, but in a SubComm)."""
        return peer

    def _all_to_all_single(self, recv: torch.Tensor, send: torch.Tensor,
                           recv_splits: Splits = None, send_splits: Splits = None) -> None:
        self._next_op()
        dist.all_to_all_single(recv, send, recv_splits, send_splits, group=self.group)

    def _all_gather_list(self, pieces: list[torch.Tensor], tensor: torch.Tensor) -> None:
        self._next_op()
        dist.all_gather(pieces, tensor, group=self.group)

    def _next_op(self) -> None:
        """Before posting an operation: in strict mode, the group's previous one must be done."""
        if self.order is not None:
            self.order.before(self.group)

    def _tag(self, tag: int) -> int:
        return STRICT_TAG if self.strict else tag

    def peer(self, offset: int) -> int:
        """Group rank `offset` places along the ring from this rank."""
        return (self.rank + offset) % self.size

    # -- bookkeeping -------------------------------------------------------------------------
    def _ledger_link(self, ledger: _ledger.Ledger, peer: int) -> str:
        if ledger.node_of_rank is not None:
            return ledger.link(self.global_ranks[self.rank], self.global_ranks[peer])
        return self.link(peer)

    def _book(self, op: str, bytes_per_peer: dict[int, int]) -> float:
        """Book bytes sent to each peer (group ranks); return the emulated duration in seconds."""
        for ledger in _ledger.active():
            for peer, nbytes in bytes_per_peer.items():
                ledger.add(op, self.label, self._ledger_link(ledger, peer), nbytes)
        if not self.links:
            return 0.0
        by_link: dict[str, int] = {}
        for peer, nbytes in bytes_per_peer.items():
            link = self.link(peer)
            by_link[link] = by_link.get(link, 0) + nbytes
        return max(
            (self.links[link].seconds(n) for link, n in by_link.items() if link in self.links),
            default=0.0,
        )

    def skip(self, nbytes: int, peer: int, op: str = "p2p") -> None:
        """Book a message of nbytes to group rank `peer` that the schedule skips (sends nothing)."""
        for ledger in _ledger.active():
            ledger.skip(op, self.label, self._ledger_link(ledger, peer), nbytes)

    def _finish(self, start: float, emulated_s: float) -> None:
        remaining = start + emulated_s - time.perf_counter()
        if remaining > 0:
            time.sleep(remaining)

    # -- point to point ------------------------------------------------------------------------
    def exchange(
        self,
        sends: Sequence[tuple[torch.Tensor, int]],
        recvs: Sequence[tuple[torch.Tensor, int]],
        tag: int = 0,
    ) -> Handle:
        """Post sends (tensor, group peer) and receives (buffer, group peer) at once; async."""
        start = self._clock([t for t, _ in sends])
        per_peer: dict[int, int] = {}
        for tensor, peer in sends:
            per_peer[peer] = per_peer.get(peer, 0) + _elem_bytes(tensor)
        emulated = self._book("p2p", per_peer)
        for buf, peer in recvs:  # a receive is as slow as the matching send
            emulated = max(emulated, self._recv_seconds(buf, peer))
        tag = self._tag(tag)
        ops = [dist.P2POp(dist.isend, t.contiguous(), group=self.group,
                          group_peer=self._group_peer(p), tag=tag) for t, p in sends]
        ops += [dist.P2POp(dist.irecv, b, group=self.group, group_peer=self._group_peer(p), tag=tag)
                for b, p in recvs]
        if not ops:
            return Handle([], [b for b, _ in recvs], emulated, start)
        self._next_op()
        works = dist.batch_isend_irecv(ops)
        handle = Handle(works, [b for b, _ in recvs], emulated, start, self.group,
                        emulating=bool(self.links), order=self.order, label=self.label)
        if self.order is not None:
            self.order.posted(self.group, handle)
        return handle

    def _recv_seconds(self, buf: torch.Tensor, peer: int) -> float:
        if not self.links:
            return 0.0
        model = self.links.get(self.link(peer))
        return model.seconds(_elem_bytes(buf)) if model else 0.0

    # -- collectives -----------------------------------------------------------------------------
    def all_to_all(
        self, tensors: Sequence[torch.Tensor], scatter_dim: int, gather_dim: int
    ) -> list[torch.Tensor]:
        """For each tensor: split into `size` chunks along scatter_dim, chunk i goes to rank i,
        and the chunks received are concatenated along gather_dim in rank order. All tensors
        travel in one all-to-all call."""
        g = self.size
        parts = [t.chunk(g, scatter_dim) for t in tensors]
        if g == 1:
            return list(tensors)
        shapes = [p[0].shape for p in parts]
        sizes = [shape.numel() for shape in shapes]
        # each tensor's chunks straight into their slots of the send buffer, in one copy
        send = torch.empty((g, sum(sizes)), dtype=tensors[0].dtype, device=tensors[0].device)
        offset = 0
        for t, p, shape, n in zip(tensors, parts, shapes, sizes, strict=True):
            slots = send[:, offset:offset + n]
            if t.shape[scatter_dim] == g * shape[scatter_dim]:  # equal chunks: one strided copy
                slots.view(g, *shape).copy_(
                    t.unflatten(scatter_dim, (g, shape[scatter_dim])).movedim(scatter_dim, 0))
            else:
                for i in range(g):
                    slots[i].view(shape).copy_(p[i])
            offset += n
        start = self._clock([send])
        per_peer = _elem_bytes(send[0])
        emulated = self._book("all_to_all", {i: per_peer for i in range(g) if i != self.rank})
        recv = torch.empty_like(send)
        with waiting(f"all_to_all on {self.label}"):
            self._all_to_all_single(recv, send)
        self._finish(start, emulated)
        out, offset = [], 0
        for shape in shapes:
            n = shape.numel()
            pieces = [recv[i, offset:offset + n].view(shape) for i in range(g)]
            out.append(torch.cat(pieces, dim=gather_dim))
            offset += n
        return out

    def all_to_all_rows(self, x: torch.Tensor, send_rows: Sequence[int], recv_rows: Sequence[int],
                        op: str = "all_to_all") -> torch.Tensor:
        """Rows [sum(send_rows[:i]), sum(send_rows[:i+1])) of x to rank i in one all-to-all of
        uneven splits; what arrives, in rank order (recv_rows[i] rows from rank i). Booked as op."""
        row = x.element_size() * (x.numel() // max(x.shape[0], 1))
        start, out = self._clock([x]), x.new_empty((sum(recv_rows), *x.shape[1:]))
        emulated = self._book(op, {i: n * row for i, n in enumerate(send_rows) if i != self.rank and n})
        with waiting(f"{op} on {self.label}"):
            self._all_to_all_single(out, x.contiguous(), list(recv_rows), list(send_rows))
        self._finish(start, emulated)
        return out

    def all_gather(self, tensor: torch.Tensor, dim: int) -> torch.Tensor:
        """Concatenate every rank's tensor along dim, in rank order."""
        g = self.size
        if g == 1:
            return tensor
        tensor = tensor.contiguous()
        start = self._clock([tensor])
        emulated = self._book(
            "all_gather", {i: _elem_bytes(tensor) for i in range(g) if i != self.rank}
        )
        with waiting(f"all_gather on {self.label}"):
            if self._nccl:
                self._next_op()
                flat = torch.empty((g, *tensor.shape), dtype=tensor.dtype, device=tensor.device)
                dist.all_gather_into_tensor(flat, tensor, group=self.group)
                pieces = list(flat.unbind(0))
            else:
                pieces = [torch.empty_like(tensor) for _ in range(g)]
                self._all_gather_list(pieces, tensor)
        self._finish(start, emulated)
        return torch.cat(pieces, dim=dim)

    def reduce_scatter(self, tensor: torch.Tensor, dim: int) -> torch.Tensor:
        """Sum the tensor over ranks and keep chunk `rank` of the sum along dim."""
        g = self.size
        if g == 1:
            return tensor
        chunks = [c.contiguous() for c in tensor.chunk(g, dim)]
        start = self._clock(chunks)
        per_peer = _elem_bytes(chunks[0])
        emulated = self._book("reduce_scatter", {i: per_peer for i in range(g) if i != self.rank})
        with waiting(f"reduce_scatter on {self.label}"):
            if self._nccl:
                self._next_op()
                out = torch.empty_like(chunks[0])
                dist.reduce_scatter_tensor(out, torch.stack(chunks), group=self.group)
            else:  # gloo has no reduce-scatter: exchange the chunks, then sum what arrived
                send = torch.stack(chunks)
                recv = torch.empty_like(send)
                self._all_to_all_single(recv, send)
                out = recv.sum(0)
        self._finish(start, emulated)
        return out


COLLECTIVE_TAG = 1000  # SubComm collectives; far from the tags algorithms give their exchanges


class SubComm(Comm):
    """Some members of a parent group, communicating point to point over the parent's group: a
    *view*, used only where a group of its own cannot be created collectively (see mesh.py).

    Why not a process group of their own (dist.new_group(..., use_local_synchronization=True)):
    torch names such a group by hashing its ranks together with how many groups the calling
    process already has, so members with different histories (in a gang, rank 0 belongs to more
    groups than rank 7) wait under different names forever. A view creates nothing, so only the
    members take part and set-up is free. Its collectives are the exchanges an all-to-all or
    all-gather makes anyway, booked as that collective.
    """

    def __init__(self, parent: Comm, members: Sequence[int], label: str):
        self.label, self.group, self.node_of = label, parent.group, parent.node_of
        self.order, self.links = parent.order, dict(parent.links)
        self._nccl = False  # the native collectives would span the whole parent group
        self._members = [parent._group_peer(m) for m in members]
        self.size, self.rank = len(members), list(members).index(parent.rank)
        self.global_ranks = [parent.global_ranks[m] for m in members]

    def _group_peer(self, peer: int) -> int:
        return self._members[peer]

    def _swap(self, sends: list[torch.Tensor], recvs: list[torch.Tensor]) -> None:
        """Send sends[i] to member i and receive recvs[i] from it, for every other member."""
        ops = []
        for i in range(self.size):
            if i != self.rank:
                peer = self._members[i]
                ops.append(dist.P2POp(dist.isend, sends[i], group=self.group, group_peer=peer,
                                      tag=self._tag(COLLECTIVE_TAG)))
                ops.append(dist.P2POp(dist.irecv, recvs[i], group=self.group, group_peer=peer,
                                      tag=self._tag(COLLECTIVE_TAG)))
        self._next_op()
        for work in dist.batch_isend_irecv(ops):
            work.wait()

    def _all_to_all_single(self, recv: torch.Tensor, send: torch.Tensor,
                           recv_splits: Splits = None, send_splits: Splits = None) -> None:
        sends = list(send.split(send_splits) if send_splits else send.unbind(0))
        recvs = list(recv.split(recv_splits) if recv_splits else recv.unbind(0))
        recvs[self.rank].copy_(sends[self.rank])
        self._swap(sends, recvs)

    def _all_gather_list(self, pieces: list[torch.Tensor], tensor: torch.Tensor) -> None:
        pieces[self.rank].copy_(tensor)
        self._swap([tensor] * self.size, pieces)
