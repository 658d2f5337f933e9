"""The house's floors (shared/design/ARCHITECTURE.md, "Layering rules"), read from the source: which
package imports which, counting imports inside functions (a function-local import is still an
import), and no import cycle among seqpar's modules."""

from __future__ import annotations

import ast
import functools
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2] / "seqpar"


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _targets(node: ast.Import | ast.ImportFrom, package: str) -> list[str]:
    """The dotted names an import statement reaches (a module where one is named, else its
    package; third-party names as written)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        parts = package.split(".")[:len(package.split(".")) - node.level + 1]
        base = ".".join([*parts, base] if base else parts)
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]


@functools.cache  # parsed once for every floor's test (read it, do not change it)
def imports() -> dict[str, set[str]]:
    """module -> every name it imports, anywhere in the file."""
    out: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        found = out.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                found.update(_targets(node, package))
    return out


def _seqpar_edges(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    edges = {}
    for mod, names in graph.items():
        edges[mod] = set()
        for name in names:
            while name not in MODULES and "." in name:
                name = name.rsplit(".", 1)[0]
            if name in MODULES and name != mod:
                edges[mod].add(name)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(edges)))
    try:
        for v in sorted(edges):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return found


def test_no_import_cycle_among_seqpars_modules():
    assert cycles(_seqpar_edges(imports())) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _layer(name: str) -> str:
    """'seqpar.workers.trial' -> 'workers'; a third-party name -> '-' + its top package."""
    parts = name.split(".")
    return parts[1] if parts[0] == "seqpar" and len(parts) > 1 else "-" + parts[0]


# seqpar package -> the packages (seqpar's; '-name' third-party) it must never import, anywhere
FORBIDDEN = {
    "algorithms": {"model", "platform", "workers", "experiments", "sweeps", "cli", "peers", "-ray",
                   "-mlflow", "-pydantic", "-typer", "-rich"},
    "model": {"platform", "workers", "experiments", "sweeps", "cli", "peers", "-ray", "-mlflow",
              "-typer", "-rich"},
    "platform": {"workers", "experiments", "sweeps", "cli"},
    "planner": {"algorithms", "model", "peers", "platform", "workers", "experiments", "sweeps", "cli",
                "-torch", "-ray", "-mlflow", "-typer", "-rich"},
    # a user's corpus read and tokenized: data tooling, no torch (seqpar plan reads corpus: lengths)
    "corpus": {"algorithms", "model", "peers", "platform", "workers", "experiments", "sweeps", "cli",
               "planner", "-torch", "-ray", "-mlflow", "-typer", "-rich"},
    "experiments": {"workers", "platform", "sweeps", "cli", "-ray", "-mlflow"},
    "workers": {"experiments", "sweeps", "cli"},
    "sweeps": {"cli"},
}


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_each_floor_imports_only_what_it_may(layer):
    broken = sorted(f"{mod} imports {name}" for mod, names in imports().items()
                    if _layer(mod) == layer for name in names
                    if _layer(name) in FORBIDDEN[layer])
    assert broken == []


# The house's size limits (issue 44): a file a newcomer can read in one sitting, and imports at the
# top of a file unless a heavy dependency must wait (each one inside a function is counted).
MAX_LINES = 400
MAX_LOCAL_IMPORTS = 20


def test_no_module_is_over_the_line_limit():
    long = sorted(f"{path.relative_to(ROOT.parent)}: {n} lines" for path in ROOT.rglob("*.py")
                  if (n := len(path.read_text().splitlines())) > MAX_LINES)
    assert long == []


def local_imports(root: pathlib.Path = ROOT) -> list[str]:
    """Where seqpar's own modules are imported inside a function (`path:line`), by the rule of the
    house's counter (shared/tools/local_imports.py): every import statement inside each function,
    relative ones included, counted once per enclosing function (a nested function's imports are
    its outer function's too); TYPE_CHECKING blocks sit at a module's top and are not counted."""
    pkg = root.name
    where = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom):
                    mod = node.module or ""
                    own = node.level > 0 or mod == pkg or mod.startswith(pkg + ".")
                elif isinstance(node, ast.Import):
                    own = any(a.name == pkg or a.name.startswith(pkg + ".") for a in node.names)
                else:
                    continue
                if own:
                    where.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    return where


def test_seqpars_own_modules_are_imported_at_the_top_but_a_few():
    where = local_imports()
    assert len(where) <= MAX_LOCAL_IMPORTS, "\n".join(where)


def test_the_local_import_counter_counts_by_the_houses_rule(tmp_path):
    pkg = tmp_path / "seqpar"
    pkg.mkdir()
    (pkg / "a.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "import seqpar.b\n"                       # top of the file: not counted
        "if TYPE_CHECKING:\n    from seqpar import c\n"
        "def f():\n"
        "    import json\n"                       # not seqpar's: not counted
        "    from seqpar import b\n"              # counted
        "    from . import c\n"                   # relative: counted
        "    def g():\n"
        "        import seqpar.b\n"               # counted for g and for f
        "class K:\n"
        "    async def h(self):\n"
        "        from seqpar.b import x\n")       # counted
    assert local_imports(pkg) == ["seqpar/a.py:7", "seqpar/a.py:8", "seqpar/a.py:10",
                                  "seqpar/a.py:10", "seqpar/a.py:13"]
