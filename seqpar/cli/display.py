"""Printing: every listing is a rich table, or JSON with --json so it can be scripted; a comparison
is printed terse (`Comparison.terse`: what is the same in every row goes to the title) with its
flags' legend and notes, or every column as JSON."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

if TYPE_CHECKING:  # the report pulls in torch; printing must not (`seqpar plan`, --help)
    from seqpar.sweeps.report.table import Comparison


def _width(stream: Any) -> int | None:
    """COLUMNS when set; a terminal's own width; else (a pipe or a CI log) 160, not rich's 80."""
    if os.environ.get("COLUMNS", "").isdigit():
        return int(os.environ["COLUMNS"])
    return None if stream.isatty() else 160


console = Console(width=_width(sys.stdout))
err_console = Console(stderr=True, width=_width(sys.stderr))


def display_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], *,
                  as_json: bool = False, highlight_row: int | None = None,
                  compact: bool = False, wrap: Sequence[str] | None = None) -> None:
    """A rich table (compact: rules under the header only, one space between columns; `wrap`:
    the only columns that may wrap to fit the width, default all), or JSON."""
    if as_json:
        print(json.dumps([dict(zip(columns, row, strict=True)) for row in rows], indent=2,
                         default=str))
        return
    table = (Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0)) if compact
             else Table(title=title, show_lines=False))
    for col in columns:
        table.add_column(col, overflow="fold", no_wrap=wrap is not None and col not in wrap)
    for i, row in enumerate(rows):
        table.add_row(*(str(c) for c in row), style="bold green" if i == highlight_row else None)
    console.print(table)


def display_comparison(cmp: Comparison, *, as_json: bool = False) -> None:
    """A comparison: every column as JSON, or the terse table (a space between columns, a rule
    under the header; only the algorithm names may fold, no other cell is narrowed or wrapped:
    the quickstart's fits 80 columns), the flags' legend and one line per note."""
    if as_json:
        display_table(cmp.title, cmp.columns, cmp.rows, as_json=True)
        return
    terse = cmp.terse()
    console.print(escape(terse.title), highlight=False)  # wrapped at the terminal, not the table
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=0, show_edge=False)
    for i, col in enumerate(terse.columns):
        fixed = col != "algorithm"
        widest = max([len(col), *(len(str(row[i])) for row in terse.rows)])
        table.add_column(col, overflow="fold", no_wrap=fixed, min_width=widest if fixed else None)
    for i, row in enumerate(terse.rows):
        table.add_row(*(str(c) for c in row), style="bold green" if i == terse.best else None)
    console.print(table)
    for line in ([terse.legend] if terse.legend else []) + terse.notes:
        console.print(escape(line), highlight=False, overflow="ellipsis", no_wrap=True)
