"""Strict collectives (SEQPAR_STRICT_COMM=1) give gloo NCCL's semantics: tags are ignored, so two
messages between the same ranks match in the order they were posted; and a group's operations run
one after the other. A schedule that leans on either shows it on CPU, as it would hang on GPUs."""

from __future__ import annotations

import pytest
import torch

from seqpar.algorithms import comm


def _comm(env, strict: bool) -> comm.Comm:
    """A Comm on ranks 0 and 1 in the mode asked: strictness is state passed where a Comm is made
    (its StrictOrder), so the shared gang's other tests keep their own."""
    return comm.Comm(env.group(2), order=comm.StrictOrder.of(strict))


def _crossed_tags(env, strict: bool, seed: int) -> list[list[float]]:
    """Rank 0 sends a (tag 1) then b (tag 2) to rank 1, which posts its receive for b first."""
    c = _comm(env, strict)
    a, b = torch.rand(3, generator=torch.Generator().manual_seed(seed)).split([1, 2])
    if env.rank == 0:
        first = c.exchange([(a, 1)], [], tag=1)
        second = c.exchange([(b[:1], 1)], [], tag=2)
        second.wait()
        first.wait()
        return []
    got_b = c.exchange([], [(torch.empty(1), 0)], tag=2)
    got_a = c.exchange([], [(torch.empty(1), 0)], tag=1)
    return [got_a.wait()[0].tolist(), got_b.wait()[0].tolist(), a.tolist(), b[:1].tolist()]


@pytest.mark.multirank
def test_tags_match_messages_without_strict_mode_and_posting_order_with_it(gang, seed):
    _, (got_a, got_b, a, b) = gang.run(_crossed_tags, False, seed, size=2)
    assert (got_a, got_b) == (a, b)  # gloo: by tag
    _, (got_a, got_b, a, b) = gang.run(_crossed_tags, True, seed, size=2)
    assert (got_a, got_b) == (b, a)  # NCCL: the first message posted fills the first receive


def _serialised(env) -> list[bool]:
    """Posting a second exchange on a group first finishes the first (strict mode)."""
    c = _comm(env, True)
    peer = 1 - env.rank
    in_flight = c.order._in_flight  # the mesh's own order: no module state
    first = c.exchange([(torch.ones(4), peer)], [(torch.empty(4), peer)], tag=5)
    in_flight_first = in_flight.get(c.group) is first
    second = c.exchange([(torch.ones(4), peer)], [(torch.empty(4), peer)], tag=6)
    done = [in_flight_first, first._works == [], in_flight.get(c.group) is second]
    second.wait()
    first.wait()  # already complete: returns at once
    return done + [c.group not in in_flight]


@pytest.mark.multirank
def test_strict_mode_runs_a_groups_operations_one_after_the_other(gang):
    for done in gang.run(_serialised, size=2):
        assert done == [True, True, True, True]
