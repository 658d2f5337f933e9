"""`seqpar plan --option KEY=VALUE`: algorithm options pinned by the user, and the configurations of
each algorithm that keep them.

A pin names one of an algorithm's own options (usp's `dhp`, `dcp`, `inner_ring`, `placement`; the
double ring's `inner_ring`; WallFacer's `team_size`, `placement`; burst's `ranks_per_node`); the
kernel's options (`backend`, `scale`, ...) stay with `--kernel`. A partial pin resolves the rest from
the algorithm's tuning space (`dhp=4` at P = 32 is usp's dhp=4, dcp=8 with every placement and
inner ring); an algorithm that does not take a pinned key drops out; a pin no configuration can
hold is a one-line error naming the algorithm's own rule.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from seqpar.errors import ConfigError, require
from seqpar.rules import algorithms
from seqpar.rules.options import Options

Pins = tuple[tuple[str, Any], ...]


def own_options(name: str) -> tuple[str, ...]:
    """The options an algorithm takes besides the kernel's (every algorithm's `Options`)."""
    common = set(Options.names())
    return tuple(k for k in algorithms.get(name).Options.names() if k not in common)


def _value(text: str) -> Any:
    low = text.strip().lower()
    if low in ("none", "null"):
        return None
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(text)
    except ValueError:
        return text.strip()


def parse(texts: Iterable[str] | None) -> Pins:
    """`--option KEY=VALUE` as given (repeatable) -> sorted (key, value) pairs; a key no algorithm
    takes, or given twice, is a one-line error."""
    known = sorted({k for n in algorithms.REGISTRY for k in own_options(n)})
    out: dict[str, Any] = {}
    for text in texts or ():
        key, eq, value = text.partition("=")
        key = key.strip().replace("-", "_")
        require(bool(eq) and bool(key) and bool(value.strip()), "option", text,
                "must be KEY=VALUE (e.g. dhp=4)")
        require(key in known, "option", text, f"names no algorithm option: {', '.join(known)} "
                "(the kernel's options: --kernel)")
        require(key not in out, "option", text, f"pins {key} twice")
        out[key] = _value(value)
    return tuple(sorted(out.items()))


def pinned(name: str, world: int, pins: Pins) -> list[dict[str, Any]]:
    """The configurations of `name` at `world` ranks that hold the pins: its tuning space with
    the pins laid over each entry, those its rules accept, once each (no pins: the space)."""
    space = algorithms.option_space(name, world)
    if not pins:
        return space
    if not set(dict(pins)) <= set(own_options(name)):
        return []
    cls = algorithms.get(name)
    out: dict[tuple, dict[str, Any]] = {}
    for entry in space:
        candidate = {**entry, **dict(pins)}
        try:
            cls.parse(candidate).check(world)
        except ConfigError:
            continue
        out.setdefault(tuple(sorted(candidate.items())), candidate)
    return list(out.values())


def space(names: Sequence[str], world: int, pins: Pins) -> list[tuple[str, dict[str, Any]]]:
    """(algorithm, options) of every named algorithm at `world` ranks under the pins."""
    return [(n, o) for n in names for o in pinned(n, world, pins)]


def check(names: Sequence[str], worlds: Sequence[int], pins: Pins) -> None:
    """One line when no named algorithm at any of `worlds` can hold the pins: the algorithm's own
    rule where one algorithm takes them, else what each takes."""
    if not pins or any(pinned(n, w, pins) for n in names for w in worlds):
        return
    shown = " ".join(f"{k}={v}" for k, v in pins)
    takers = [n for n in names if set(dict(pins)) <= set(own_options(n))]
    if len(takers) == 1:
        cls = algorithms.get(takers[0])
        for w in worlds:
            cls.parse(dict(pins)).check(w)  # the algorithm's own rule, in its words
        raise ConfigError("option", shown, f"no configuration of {takers[0]} on "
                          f"{'/'.join(map(str, worlds))} ranks holds it")
    takes = "; ".join(f"{n} takes {', '.join(own_options(n)) or 'none'}" for n in names)
    raise ConfigError("option", shown, f"no algorithm here takes every pinned option ({takes})"
                      if not takers else f"no configuration of {', '.join(takers)} on "
                      f"{'/'.join(map(str, worlds))} ranks holds it")
