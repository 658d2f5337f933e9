"""Frozen records that check their fields as a strict pydantic model does (extra fields refused,
numbers bounded, ints taken as floats, pydantic's messages), without importing pydantic for values
already of their fields' types: a plan of presets starts without it. A value that is not (a dict
for a record, a list for a tuple, "8" for an int, a number out of bounds) goes through a pydantic
model of the same fields, built on first use, which converts it or raises its ValidationError.

    @dataclass(frozen=True, kw_only=True)
    class Link(Record):
        bandwidth_gb_per_s: float = Field(gt=0, description="GB/s")
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from dataclasses import MISSING, dataclass, fields
from dataclasses import field as _field
from functools import cache
from typing import Any, TypeVar

R = TypeVar("R", bound="Record")


def Field(default: Any = MISSING, *, default_factory: Callable[[], Any] | Any = MISSING,
          gt: float | None = None, ge: float | None = None, description: str = "") -> Any:
    """A record's field: its default (or factory), bounds and description, as pydantic's Field."""
    bounds = {k: v for k, v in (("gt", gt), ("ge", ge)) if v is not None}
    return _field(default=default, default_factory=default_factory,
                  metadata={**bounds, "description": description})


class _Unplain(Exception):
    """A value that is not already of its field's type: pydantic decides."""


def _scalar(kind: type) -> Callable[[Any], Any]:
    def check(v: Any) -> Any:
        if type(v) is kind:
            return v
        if kind is float and type(v) is int:
            return float(v)
        raise _Unplain

    return check


def _optional(inner: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda v: None if v is None else inner(v)


def _dict(key: Callable[[Any], Any], value: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def check(v: Any) -> Any:
        if type(v) is not dict:
            raise _Unplain
        return {key(k): value(x) for k, x in v.items()}

    return check


def _floats(*lengths: int) -> Callable[[Any], Any]:
    def check(v: Any) -> Any:
        if type(v) is not tuple or len(v) not in lengths:
            raise _Unplain
        return tuple(_scalar(float)(x) for x in v)

    return check


def _checkers(records: dict[str, type]) -> dict[str, Callable[[Any], Any]]:
    """Each annotation a record uses -> what takes a value already of its type (`_Unplain`
    otherwise); records by name: taken as they are."""
    def one(kind: type) -> Callable[[Any], Any]:
        def check(v: Any) -> Any:
            if type(v) is not kind:
                raise _Unplain
            return v

        return check

    s, i, f, b = _scalar(str), _scalar(int), _scalar(float), _scalar(bool)
    got = {"str": s, "int": i, "float": f, "bool": b, "str | None": _optional(s),
           "int | None": _optional(i), "float | None": _optional(f),
           "dict[str, float]": _dict(s, f), "dict[int, float]": _dict(i, f),
           "dict[str, dict[int, float]]": _dict(s, _dict(i, f)),
           "dict[int, tuple[float, float] | tuple[float, float, float]]": _dict(i, _floats(2, 3)),
           "dict[int, tuple[float, float]]": _dict(i, _floats(2))}
    for name, kind in records.items():
        got[name] = one(kind)
        got[f"dict[str, {name}]"] = _dict(s, one(kind))
    return got


@dataclass(frozen=True, kw_only=True)
class Record:
    """A frozen record of checked fields (the module docstring), with the pydantic methods its
    callers use: model_copy, model_dump(_json), model_validate(_json)."""

    def __post_init__(self) -> None:
        for f in fields(self):  # _Unplain: `record`'s __init__ asks pydantic
            object.__setattr__(self, f.name, _plain(f, getattr(self, f.name)))

    def __str__(self) -> str:
        return " ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self))

    def model_copy(self: R, update: dict[str, Any] | None = None) -> R:
        """A copy with `update`'s fields replaced, unchecked (as pydantic's)."""
        out = copy.copy(self)
        for name, value in (update or {}).items():
            object.__setattr__(out, name, value)
        return out

    def model_dump(self, mode: str = "python") -> dict[str, Any]:
        """The fields as a dict, records as dicts; `mode="json"`: tuples as lists, keys as
        strings."""
        return {f.name: _dump(getattr(self, f.name), mode == "json") for f in fields(self)}

    def model_dump_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def model_validate(cls: type[R], data: Any) -> R:
        """A record of `data` (a dict of its fields), checked: pydantic's ValidationError if not."""
        return cls(**_unmodel(_model(cls).model_validate(_raw(data))))

    @classmethod
    def model_validate_json(cls: type[R], text: str | bytes) -> R:
        return cls(**_unmodel(_model(cls).model_validate_json(text)))


def _plain(f: Any, value: Any) -> Any:
    """`value` as field `f` holds it, when already of its type and within its bounds."""
    got = _CHECK[f.type](value)
    if got is not None and (("gt" in f.metadata and not got > f.metadata["gt"])
                            or ("ge" in f.metadata and not got >= f.metadata["ge"])):
        raise _Unplain
    return got


def _raw(value: Any) -> Any:
    """A value as pydantic's models held it: records as their models, unchecked (pydantic takes
    a model's instance as it is)."""
    if isinstance(value, Record):
        return _model(type(value)).model_construct(
            **{f.name: _raw(getattr(value, f.name)) for f in fields(value)})
    if isinstance(value, dict):
        return {k: _raw(v) for k, v in value.items()}
    return value


def _dump(value: Any, json_mode: bool) -> Any:
    if isinstance(value, Record):
        return value.model_dump("json" if json_mode else "python")
    if isinstance(value, dict):
        return {(str(k) if json_mode and not isinstance(k, str) else k): _dump(v, json_mode)
                for k, v in value.items()}
    if isinstance(value, tuple) and json_mode:
        return [_dump(v, json_mode) for v in value]
    return value


@cache
def _model(cls: type[Record]) -> Any:
    """The pydantic model of `cls`'s fields (of its records' models where a field holds one)."""
    import pydantic  # a value that is not of its field's type: pydantic's rules, pydantic's words

    used = " ".join(str(f.type) for f in fields(cls))
    names = {"__builtins__": __builtins__, **{n: _model(r) for n, r in _RECORDS.items()
                                               if re.search(rf"\b{n}\b", used)}}
    defs = {}
    for f in fields(cls):
        kw = {k: v for k, v in f.metadata.items() if k != "description"}
        if f.default is not MISSING:
            kw["default"] = f.default
        elif f.default_factory is not MISSING:
            kw["default_factory"] = f.default_factory
        defs[f.name] = (eval(f.type, names), pydantic.Field(  # our own annotations
            description=f.metadata.get("description") or None, **kw))
    model = pydantic.create_model(cls.__name__, __config__=pydantic.ConfigDict(
        extra="forbid", frozen=True), **defs)
    _RECORD_OF[model] = cls
    return model


def _unmodel(m: Any) -> dict[str, Any]:
    """A pydantic model's fields, its records' models as records."""
    def back(v: Any) -> Any:
        if type(v) in _RECORD_OF:
            return _RECORD_OF[type(v)](**_unmodel(v))
        if isinstance(v, dict):
            return {k: back(x) for k, x in v.items()}
        return v

    return {name: back(getattr(m, name)) for name in type(m).model_fields}


_RECORDS: dict[str, type[Record]] = {}
_RECORD_OF: dict[type, type[Record]] = {}
_CHECK: dict[str, Callable[[Any], Any]] = {}


def record(cls: type[R]) -> type[R]:
    """Register a record class (a frozen, keyword-only dataclass of `Record`): its name is a type
    other records' fields may take; what it is built of goes through its pydantic model where a
    value is not of its field's type, or a field is missing or unknown (pydantic's error)."""
    _RECORDS[cls.__name__] = cls
    _CHECK.clear()
    _CHECK.update(_checkers(_RECORDS))
    for f in fields(cls):
        if f.type not in _CHECK:
            raise TypeError(f"{cls.__name__}.{f.name}: no check for {f.type}")
    plain = cls.__init__

    def __init__(self: Record, **given: Any) -> None:
        try:
            plain(self, **given)
        except (_Unplain, TypeError):
            checked = _model(cls).model_validate({k: _raw(v) for k, v in given.items()})
            plain(self, **_unmodel(checked))

    __init__.__doc__ = plain.__doc__
    cls.__init__ = __init__  # type: ignore[method-assign]
    return cls

