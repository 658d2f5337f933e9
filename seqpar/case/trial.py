"""`Trial`: a case with where it runs (nodes, ranks per node, emulated links, timeout, the ranks'
environment variables) in an explicit gang, validated once, when it is made."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass

from seqpar.algorithms.comm import LinkModel
from seqpar.case.attention import Case
from seqpar.case.train import TrainCase
from seqpar.errors import require
from seqpar.rules.grids import ranks_per_node_of

GANG_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")     # it names Ray actors: seqpar:<gang>:rank-<r>
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Trial:
    """One trial: the case, where it runs and in which gang. Validated when it is made (a
    ConfigError before any actor starts); afterwards nothing checks it again.

        trial = Trial(Case("ring", world=4), gang_id="mine", nodes=2,
                      links={"inter": LinkModel(1e-3, 1e9)})

    `links` and `env_vars` may be given as mappings; they are kept as sorted pairs (frozen, one
    form). `ranks_per_node` defaults to world / nodes. Trials with equal `gang_id` (and world,
    device and variables) share a gang of rank actors: start-up is the expensive part."""

    case: Case | TrainCase
    gang_id: str
    nodes: int = 1
    ranks_per_node: int | None = None
    links: tuple[tuple[str, LinkModel], ...] = ()   # link class -> its emulated model
    timeout_s: float = 300.0                         # rendezvous to the last rank's result
    env_vars: tuple[tuple[str, str], ...] = ()       # every rank starts with these

    def __post_init__(self) -> None:
        for name in ("links", "env_vars"):
            value = getattr(self, name)
            pairs = value.items() if isinstance(value, Mapping) else (value or ())
            object.__setattr__(self, name, tuple(sorted(pairs)))
        require(isinstance(self.case, Case | TrainCase), "case", type(self.case).__name__,
                "must be a seqpar Case or TrainCase")
        self.case.validate()
        object.__setattr__(self, "ranks_per_node",
                           ranks_per_node_of(self.case.world, self.nodes, self.ranks_per_node))
        require(isinstance(self.gang_id, str) and GANG_ID.fullmatch(self.gang_id) is not None,
                "gang_id", self.gang_id, "must be letters, digits, '_', '.' or '-'")
        for link, model in self.links:
            require(link in ("intra", "inter"), "link_emulation", link,
                    "keys are 'intra' and 'inter'")
            require(isinstance(model, LinkModel), f"link_emulation[{link}]", model,
                    "must be a LinkModel(latency_s, bandwidth_bytes_per_s)")
            require(model.latency_s >= 0, f"link_emulation[{link}].latency_s", model.latency_s,
                    "must be >= 0")
            require(model.bandwidth_bytes_per_s > 0,
                    f"link_emulation[{link}].bandwidth_bytes_per_s", model.bandwidth_bytes_per_s,
                    "must be > 0")
        require(self.timeout_s > 0, "timeout_s", self.timeout_s, "must be > 0")
        for key, value in self.env_vars:
            require(ENV_NAME.fullmatch(key) is not None and isinstance(value, str), "env_vars", key,
                    "must name an environment variable (letters, digits, '_') with a string value")

    @property
    def world(self) -> int:
        return self.case.world

    @property
    def link_models(self) -> dict[str, LinkModel] | None:
        """The emulated link classes (None: none), as the ranks' Comms take them."""
        return dict(self.links) or None

    @property
    def env(self) -> dict[str, str]:
        return dict(self.env_vars)

    def in_gang(self, gang_id: str) -> Trial:
        """The same (already validated) trial in another gang."""
        require(isinstance(gang_id, str) and GANG_ID.fullmatch(gang_id) is not None, "gang_id",
                gang_id, "must be letters, digits, '_', '.' or '-'")
        new = object.__new__(Trial)  # not dataclasses.replace: it would validate again
        for f in dataclasses.fields(self):
            object.__setattr__(new, f.name, getattr(self, f.name))
        object.__setattr__(new, "gang_id", gang_id)
        return new
