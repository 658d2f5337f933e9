"""The families' SP exactness matrix (`make test-full`; test_family_exactness.py says what is held
and runs one representative of each scenario under `make test`):

- fixed length: every family x algorithm x P in {2, 3, 4} x layout (contiguous, zigzag, stripe,
  balanced), one gang call for a family's four layouts;
- steps of variable-length sequences: every family x algorithm x P x policy (static, dynamic), the
  layout rotating so that each family and algorithm meets every layout.
"""

from __future__ import annotations

import pytest

from tests.multirank.test_family_exactness import (
    ALGORITHMS,
    FAMILIES,
    LAYOUTS,
    POLICIES,
    WORLDS,
    check_fixed,
    check_step,
    family,
    fixed_cases,
    step_case,
)


@pytest.mark.slow
@pytest.mark.multirank
@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("name", FAMILIES)
def test_family_fixed_length_matrix(gang, name, algorithm, world, seed):
    check_fixed(gang, fixed_cases(name, family(name), algorithm, world, LAYOUTS, seed))


@pytest.mark.slow
@pytest.mark.multirank
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("name", FAMILIES)
def test_family_lengths_matrix(gang, name, algorithm, world, policy, seed):
    k = WORLDS.index(world) + 3 * POLICIES.index(policy)  # 6 steps: every layout met
    layout = LAYOUTS[(k + ALGORITHMS.index(algorithm)) % len(LAYOUTS)]
    check_step(gang, step_case(family(name), algorithm, world, policy, layout, seed))
