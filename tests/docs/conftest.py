"""The docs test's local Ray head (make test-full); its summary line is tests/docs/summary.py's."""

from __future__ import annotations

import pytest

from tests.ray_head import local_ray_head


@pytest.fixture(scope="module")
def ray_head():
    """A local head of our own (tests/ray_head.py): its GCS and dashboard addresses."""
    with local_ray_head("sp-docs-", cpus=4) as head:
        yield head
