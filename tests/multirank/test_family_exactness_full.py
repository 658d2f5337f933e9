"""The families' SP exactness matrix (`make test-full`; test_family_exactness.py says what is held
and runs one representative of each scenario under `make test`):

- fixed length: every family x algorithm x P in {2, 3, 4} x layout (contiguous, zigzag, stripe,
  balanced; balanced not for a model whose layers' windows differ: it refuses it), one gang call
  for a family's layouts;
- steps of variable-length sequences: every family x algorithm x P x policy (static, dynamic), the
  layout rotating so that each family and algorithm meets every layout.
"""

from __future__ import annotations

import pytest

from tests.multirank.test_family_exactness import (
    ALGORITHMS,
    FAMILIES,
    POLICIES,
    WORLDS,
    check_fixed,
    check_step,
    family,
    fixed_cases,
    layouts_of,
    no_aux_loss,
    step_case,
)


@pytest.mark.slow
@pytest.mark.multirank
@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("name", FAMILIES)
def test_family_fixed_length_matrix(gang, name, algorithm, world, seed):
    cfg = family(name)
    check_fixed(gang, fixed_cases(name, cfg, algorithm, world, layouts_of(cfg), seed))


@pytest.mark.slow
@pytest.mark.multirank
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("name", FAMILIES)
def test_family_lengths_matrix(gang, name, algorithm, world, policy, seed):
    cfg = family(name)
    no_aux_loss(name, cfg)
    layouts = layouts_of(cfg)
    k = WORLDS.index(world) + 3 * POLICIES.index(policy)  # 6 steps: every layout met
    layout = layouts[(k + ALGORITHMS.index(algorithm)) % len(layouts)]
    check_step(gang, step_case(cfg, algorithm, world, policy, layout, seed))
