"""A plan as a file: `seqpar plan --save FILE` writes the question (every flag under its long
name, its default resolved, the seqpar version), `seqpar plan FILE` (or `--from FILE`) asks it
again; a flag given on the command line wins over the file's value."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

import typer

from seqpar.cli.display import err_console
from seqpar.errors import ConfigError, require

PANELS = ("The model and the data", "The cluster", "What to search", "What to show")
FILE_PANEL = "The question as a file"
VERSION = "seqpar"  # the file's key for the version that wrote it
# what a null means in the file, written beside it (a default that is a rule, not a value)
NULLS = {"lengths": "one length, seq-len", "nodes": "world / GPUs a node",
         "tokens_per_step": "one sequence a DP replica (with lengths: world x capacity)",
         "capacity": "the longest sequence, at most seq-len", "validate": "plan, not validate",
         "option": "no pin", "ep": "searched (1 for a dense model)"}


@dataclass(frozen=True)
class Question:
    """What `seqpar plan` is asked: one field per flag (--seq-len: seq_len, --json: as_json)."""

    model: str
    seq_len: int
    mask: str
    dtype: str
    lengths: str | None
    capacity: int | None
    tokens_per_step: int | None
    batches: int
    cluster: str
    world: int
    nodes: int | None
    kernel: str
    scope: str
    sp: int | None
    algorithm: str | None
    layout: str | None
    option: list[str] | None
    ep: int | None
    routing_skew: float
    states: str | None
    checkpoint: str | None
    fused_head: bool | None
    offload: str | None
    tiled: bool | None
    sp_policy: str | None
    packing: str | None
    group_sizes: str
    degrees: str
    max_seq: bool
    top: int
    as_json: bool
    validate: str | None


TYPES = get_type_hints(Question)  # a file's value takes its field's type


def version() -> str:
    from importlib import metadata  # ~20 ms to import: only where a file is written

    try:
        return metadata.version("seqpar")
    except metadata.PackageNotFoundError:  # a source tree never installed
        return "unknown"


def asked(ctx: typer.Context) -> list[Any]:
    """The command's parameters that are the question (not the file's own: FILE, --from, --save,
    and not --help), in the help's order."""
    return [p for p in ctx.command.params if getattr(p, "rich_help_panel", None) in PANELS]


def key_of(param: Any) -> str:
    """A parameter's key in the file: its long flag without the dashes (--seq-len: seq-len)."""
    return next(o for o in param.opts if o.startswith("--"))[2:]


def question(ctx: typer.Context, path: str | None) -> Question:
    """The command line's values, and for every flag not given there the file's at `path`."""
    values = {p.name: _plain(ctx.params[p.name]) for p in asked(ctx)}
    if path is not None:
        given = {name for name in values if _source(ctx, name) == "COMMANDLINE"}
        values.update({k: v for k, v in read(path, ctx).items() if k not in given})
    return Question(**values)


def read(path: str, ctx: typer.Context) -> dict[str, Any]:
    """The values of a plan file by parameter name; an unknown key or a bad value is one line
    naming the key; a file another seqpar version wrote is said (on stderr), not refused."""
    file = Path(path)
    require(file.is_file(), "plan", path, "no such file (a plan file is what `seqpar plan "
            "--save FILE` writes)")
    import yaml  # only for a plan file: a plan asked by its flags needs none (a tenth of its start)

    try:
        data = yaml.safe_load(file.read_text())
    except yaml.YAMLError as err:
        raise ConfigError("plan", path, f"is not YAML: {' '.join(str(err).split())}") from None
    require(isinstance(data, dict), "plan", path, "must map the flags' long names to values "
            "(what `seqpar plan --save FILE` writes)")
    params = {key_of(p): p for p in asked(ctx)}
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key == VERSION:
            if str(value) != version():
                err_console.print(f"note: {path} was written by seqpar {value}; this is "
                                  f"{version()}: its defaults and answers may differ",
                                  highlight=False, soft_wrap=True)
            continue
        if key not in params:
            near = difflib.get_close_matches(str(key).replace("_", "-"), list(params), n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            raise ConfigError(str(key), value, f"in {path}: no such key{hint}; the keys are "
                              "the flags' long names (seqpar plan --help)")
        values[params[key].name] = _value(params[key], key, value, path)
    return values


def _value(param: Any, key: str, value: Any, path: str) -> Any:
    """The file's `value` for `param`, of the type its flag takes (one line naming the key)."""
    kinds = get_args(TYPES[param.name]) or (TYPES[param.name],)
    kind = next(k for k in kinds if k is not type(None))
    if value is None:
        require(type(None) in kinds, key, value, f"in {path}: needs a value (leave the key out "
                f"for the default, {param.default})")
        return None
    if get_origin(kind) is list:
        require(isinstance(value, list) and all(isinstance(v, str | int) for v in value), key,
                value, f"in {path}: must be a list of KEY=VALUE words, as --{key} repeated")
        return [str(v) for v in value] or None
    if kind is bool:
        require(isinstance(value, bool), key, value, f"in {path}: must be true or false")
        return value
    require(not isinstance(value, bool) and isinstance(value, int if kind is int else
                                                       str | int | float),
            key, value, f"in {path}: must be {'an integer' if kind is int else 'a string'}")
    return kind(value)


def write(path: str, q: Question, ctx: typer.Context, resolved: dict[str, str]) -> None:
    """The question as YAML, its flags under the help's panels, a null beside what it means
    (`resolved`: the value a null stands for in this question, by parameter name)."""
    lines = ["# seqpar plan's question: `seqpar plan FILE` asks it again; a flag given beside",
             "# FILE wins over its value here. Keys: the flags' long names (seqpar plan --help).",
             _line(VERSION, version()), ""]
    for panel in PANELS:
        lines.append(f"# {panel}")
        for p in asked(ctx):
            if p.rich_help_panel == panel:
                value = getattr(q, p.name)
                meaning = NULLS.get(p.name, "any") if value is None else ""
                if value is None and p.name in resolved:
                    meaning += f": {resolved[p.name]}"
                lines.append(_line(key_of(p), value) + (f"  # {meaning}" if meaning else ""))
        lines.append("")
    Path(path).write_text("\n".join(lines))


def _line(key: str, value: Any) -> str:
    import yaml  # only for a plan file (`read`)

    return yaml.safe_dump({key: value}, default_flow_style=True, sort_keys=False,
                          width=10_000).strip().removeprefix("{").removesuffix("}")


def _plain(value: Any) -> Any:
    """A parsed value as the file holds it: a repeated flag's tuple as a list (none: null)."""
    return (list(value) or None) if isinstance(value, tuple | list) else value


def _source(ctx: typer.Context, name: str) -> str | None:
    source = ctx.get_parameter_source(name)
    return None if source is None else source.name
