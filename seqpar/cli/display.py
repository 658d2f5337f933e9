"""Printing: every listing is a rich table, or JSON with --json so it can be scripted."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

# a pipe or a CI log gets wide tables instead of rich's 80-column default
console = Console(width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)


def display_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], *,
                  as_json: bool = False, highlight_row: int | None = None) -> None:
    if as_json:
        print(json.dumps([dict(zip(columns, row, strict=True)) for row in rows], indent=2,
                         default=str))
        return
    table = Table(title=title, show_lines=False)
    for col in columns:
        table.add_column(col, overflow="fold")
    for i, row in enumerate(rows):
        table.add_row(*(str(c) for c in row), style="bold green" if i == highlight_row else None)
    console.print(table)
