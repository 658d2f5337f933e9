"""Expert parallelism is exact (issue 45): a tiny Mixtral- or Qwen3-MoE-shaped model's step with
its experts spread over EP groups of a DP x SP world equals the one-process model in float64 —
the loss and every gradient, the experts' gathered back to their full tensors — and each rank's
dispatch and combine all-to-all bytes (ledger group `ep`) equal the count from the routing:
rows sent plus rows received, x hidden x 8 bytes, each MoE layer, forward and backward.

`make test` runs one covering case (EP 4 over SP 2 x DP 2: an EP group spans two replicas;
FSDP2 states: the experts sharded over their EDP group; the Qwen3-MoE shape: a dense layer
beside the MoE ones); the matrix is make test-full's: family x EP {2, 4} x SP {1, 2, 4} x
ring / Ulysses x replicated / FSDP2 x a fixed-length step / a static step of lengths, and
steps of the dynamic policy with equal counts (groups of several sizes in one step).
"""

from __future__ import annotations

import itertools
import math

import pytest

from tests.multirank.ep_cases import FAMILIES, EPCase, check


@pytest.mark.multirank
def test_an_ep_step_over_replicas_with_fsdp_matches_one_process(gang, seed):
    check(gang, EPCase("qwen3-moe", ep=4, sp=2, dp=2, algorithm="ring", states="fsdp",
                       seed=seed % 10_000))


MATRIX = [(f, ep, sp, a, st, ln) for f, ep, sp, a, st, ln in itertools.product(
    FAMILIES, (2, 4), (1, 2, 4), ("ring", "ulysses"), ("replicated", "fsdp"), (False, True))]


@pytest.mark.slow
@pytest.mark.multirank
@pytest.mark.parametrize(("name", "ep", "sp", "algorithm", "states", "lengths"), MATRIX)
def test_the_ep_matrix_matches_one_process(gang, seed, name, ep, sp, algorithm, states, lengths):
    world = math.lcm(ep, sp)
    check(gang, EPCase(name, ep, sp, world // sp, algorithm, states, lengths=lengths,
                       seed=seed % 10_000))


@pytest.mark.slow
@pytest.mark.multirank
@pytest.mark.parametrize("checkpoint", ["full", "sc++"])
def test_an_ep_step_recomputing_its_blocks_matches_one_process(gang, seed, checkpoint):
    """A recomputed block sends its all-to-alls again (booked as forward, twice the bytes)."""
    check(gang, EPCase("mixtral", ep=2, sp=2, dp=2, checkpoint=checkpoint, seed=seed % 10_000))


@pytest.mark.slow
@pytest.mark.multirank
@pytest.mark.parametrize(("name", "states"), [("mixtral", "replicated"), ("qwen3-moe", "fsdp")])
@pytest.mark.parametrize("ep", [2, 4])
def test_an_ep_step_of_the_dynamic_policy_with_equal_counts_matches_one_process(
        gang, seed, name, states, ep):
    """Groups of several sizes in one step (every rank as many micro-batches, as EP needs)."""
    check(gang, EPCase(name, ep, 4, 1, states=states, lengths=True, policy="dynamic",
                       seed=seed % 10_000))
