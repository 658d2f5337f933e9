"""Typed algorithm options: one frozen, validated dataclass per algorithm, defaults in one place.

    opts = UspOptions.parse({"dhp": 2})         # unknown key or bad value: ConfigError, one line
    opts.check(world=8)                         # the rules that need the world size
    UspOptions.space(8)                          # every configuration worth tuning at P = 8

Rules that need no world size run in `__post_init__`; `check(world)` adds those that do. Every error
is a `ConfigError(field, value, rule)`. `space(world)` enumerates the tuning space, so the tuner
needs no per-algorithm tables.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from seqpar.errors import require

BACKENDS = ("auto", "flash", "torch", "cudnn", "math")  # the local kernels (algorithms.kernels)
GRAD_DTYPES = ("accumulate", "input")


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Options:
    """What every algorithm takes: the local kernel, the softmax scale, the dtype in which
    gradients that are summed elsewhere travel ('accumulate': float32, float64 for float64 inputs,
    so a bf16 ring does not round its dK,dV at every hop; 'input': the input dtype), and whether
    ring schedules skip the transfers of blocks no query of the ranks ahead sees (`route`; the
    ring-based algorithms: ring, usp's and the double ring's context ring, burst, WallFacer's
    sub-rings; collectives send what they send)."""

    backend: str = "auto"
    scale: float | None = None
    grad_dtype: str = "accumulate"
    skip_transfers: bool | None = None  # None: skip where the call has documents or a window

    def __post_init__(self) -> None:
        require(self.backend in BACKENDS, "backend", self.backend,
                f"must be one of {', '.join(BACKENDS)}")
        require(self.scale is None or (isinstance(self.scale, int | float)
                                       and not isinstance(self.scale, bool) and self.scale > 0),
                "scale", self.scale, "must be a positive number (default 1/sqrt(head_dim))")
        require(self.grad_dtype in GRAD_DTYPES, "grad_dtype", self.grad_dtype,
                f"must be one of {', '.join(GRAD_DTYPES)}")
        require(self.skip_transfers is None or isinstance(self.skip_transfers, bool),
                "skip_transfers", self.skip_transfers,
                "must be true, false or null (skip where there are documents or a window)")

    def skips(self, relation: Any) -> bool:
        """Whether the ring schedules skip transfers for a call under `relation` (a
        `layouts.Relation`): as `skip_transfers` says, and by default only with documents or a
        window, so a plain full or causal call moves the bytes its paper counts."""
        return (not relation.plain) if self.skip_transfers is None else self.skip_transfers

    # -- construction --------------------------------------------------------------------------
    @classmethod
    def names(cls) -> tuple[str, ...]:
        got = _NAMES.get(cls)
        if got is None:
            got = _NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
        return got

    @classmethod
    def parse(cls, options: Mapping[str, Any] | Options | None, algorithm: str = "") -> Options:
        """Options from a mapping; an unknown key names the keys this algorithm takes. Memoised
        where every value is a plain str, int, bool, float or None (a plan parses each
        configuration's options at every check; the options are frozen: one is shared)."""
        if isinstance(options, cls):
            return options
        if isinstance(options, Options):
            options = options.as_dict()
        options = dict(options or {})
        plain = plain_key(options)
        key = None if plain is None else (cls, plain)
        got = _PARSED.get(key) if key is not None else None
        if got is not None:
            return got
        names = cls.names()
        unknown = next((key for key in options if key not in names), None)
        require(unknown is None, "option", unknown,
                f"{algorithm or cls.__name__} takes {', '.join(sorted(names))}")
        got = cls(**options)
        if key is not None:
            if len(_PARSED) >= 4096:
                _PARSED.clear()
            _PARSED[key] = got
        return got

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def changed(self) -> dict[str, Any]:
        """The options that differ from their defaults."""
        default = type(self)()
        return {k: v for k, v in self.as_dict().items() if getattr(default, k) != v}

    # -- rules and tuning space ----------------------------------------------------------------
    def check(self, world: int) -> None:
        """Rules that need the world size (none by default)."""

    @classmethod
    def space(cls, world: int) -> list[Options]:
        """Every configuration worth tuning at this world size (default: the defaults)."""
        return [cls()]


_NAMES: dict[type, tuple[str, ...]] = {}
_PARSED: dict[tuple, Options] = {}
_PLAIN = (str, int, bool, type(None))


def plain_key(options: Mapping[str, Any]) -> frozenset | None:
    """A memo key of options whose values are all plain: each (key, type, value), a float by its
    repr (-0.0 is not 0.0); None where a value is anything else (then: no memo)."""
    items = []
    for k, v in options.items():
        t = type(v)
        if t in _PLAIN:
            items.append((k, t, v))
        elif t is float:
            items.append((k, t, repr(v)))
        else:
            return None
    return frozenset(items)
