"""NCCL's order on any backend (strict mode, see `comm`): a group's operations one after the other.

`StrictOrder` is state passed where Comms are made (like links): the meshes' builders make one per
mesh (`strict=`, default SEQPAR_STRICT_COMM=1, read there) and its Comms share it.
"""

from __future__ import annotations

import os
from typing import Any

STRICT_ENV_VAR = "SEQPAR_STRICT_COMM"  # "1": NCCL's semantics on any backend (module docstring)
STRICT_TAG = 0


def strict_mode() -> bool:
    """The default for meshes built without `strict=`: SEQPAR_STRICT_COMM=1."""
    return os.environ.get(STRICT_ENV_VAR, "0") == "1"


class StrictOrder:
    """NCCL's order for the Comms that share it: per process group, the Handle of its operation in
    flight (at most one, as on one NCCL stream), waited for before the group's next is posted."""

    def __init__(self) -> None:
        self._in_flight: dict[Any, Any] = {}

    @classmethod
    def of(cls, strict: bool | None) -> StrictOrder | None:
        """An order for strict=True, none for False; None: as the environment says."""
        return cls() if (strict_mode() if strict is None else strict) else None

    def before(self, group: Any) -> None:
        """Before posting on `group`: wait for the group's operation in flight."""
        handle = self._in_flight.pop(group, None)
        if handle is not None:
            handle.complete()

    def posted(self, group: Any, handle: Any) -> None:
        self._in_flight[group] = handle

    def done(self, group: Any, handle: Any) -> None:
        if self._in_flight.get(group) is handle:
            del self._in_flight[group]
