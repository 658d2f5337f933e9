"""Printing: every listing is a rich table, or JSON with --json so it can be scripted."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table


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
