"""A command's plain values (a str, an int, a float, a bool, a repeated str) coerced as typer's
own coercion would, without building it: typer 0.29 coerces every parameter's value, defaults
too, through a pydantic TypeAdapter made on first use, and importing typer's adapters (pydantic's
types and validators) and building one a parameter is a tenth of `seqpar plan`'s start. A value
the plain rules do not take as it comes (`--world 1_000`, `--world x`, a path, a choice, a range)
goes to typer's coercion, built then: the same value or the same error."""

from __future__ import annotations

import re
from typing import Any

from typer.core import TyperGroup

try:  # typer >= 0.28: coercion by a RuntimeParam a parameter builds on first use
    from typer._coercion import RuntimeParam, build_runtime_param
except ImportError:  # an older typer coerces through click's types: nothing to spare
    RuntimeParam = None  # type: ignore[assignment,misc]

# what pydantic's lax int takes from a string, and int() the same way: pydantic also takes
# "+5", " 5", "1_000", "5.0" (those go to typer's coercion)
_INT = re.compile(r"-?[0-9]{1,18}")
_FLOAT = re.compile(r"-?[0-9]{1,18}(\.[0-9]{1,18})?")  # "1.5", "2": float() reads them as pydantic does
_PLAIN = (str, int, float, bool, list[str])


def _plain(value: Any, kind: Any) -> tuple[bool, Any]:
    """(True, the value typer's adapter gives) where the plain rules know it, else (False, None)."""
    if kind is list[str]:
        if isinstance(value, (list, tuple)) and all(type(v) is str for v in value):
            return True, list(value)
        return False, None
    if type(value) is kind:
        return True, value
    if kind is int and type(value) is str and _INT.fullmatch(value):
        return True, int(value)
    if kind is float and (type(value) is int or type(value) is str and _FLOAT.fullmatch(value)):
        return True, float(value)
    return False, None


if RuntimeParam is not None:
    class PlainParam(RuntimeParam):
        """A plain parameter's coercion: `_plain`, else typer's (built for that value)."""

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            known, got = _plain(value, self.annotation)
            if known:
                return got
            return build_runtime_param(param.type_descriptor)._coerce_value(value, param=param,
                                                                            ctx=ctx)


def install(command: Any, ctx: Any) -> None:
    """Give each plain parameter of `command`, its help option included (made here as its own
    context makes it; `ctx`: that context, or its parent's), and of a group's commands built so
    far, the plain coercion; a parameter typer coerces otherwise (a parser, a click type, a
    choice, a range, a file, a path) keeps typer's."""
    if RuntimeParam is None:
        return
    try:
        _install(command, ctx)
    except (AttributeError, TypeError):  # a typer whose internals moved: its own coercion
        return


def _install(command: Any, ctx: Any) -> None:
    if ctx.command is not command:
        ctx = command.context_class(command, parent=ctx, **command.context_settings)
    for param in command.get_params(ctx):
        desc = getattr(param, "type_descriptor", None)
        if (desc is None or getattr(param, "_runtime_param", False) is not None
                or desc.annotation not in _PLAIN or desc.file_annotation is not None):
            continue
        info = desc.parameter_info
        if (info.parser is not None or getattr(info, "click_type", None) is not None
                or info.min is not None or info.max is not None or desc.is_choice):
            continue
        param._runtime_param = PlainParam(parameter_info=info, annotation=desc.annotation)
    if isinstance(command, TyperGroup):
        for sub in command.commands.values():
            _install(sub, ctx)
