"""The `seqpar` command. Heavy imports (torch, ray, mlflow) live inside commands: --help is instant."""

from __future__ import annotations

import sys

import typer

from seqpar.errors import SeqparError

app = typer.Typer(
    name="seqpar", no_args_is_help=True, add_completion=False,
    help="Measure sequence-parallel attention algorithms across many ranks.",
)


@app.callback()
def _root() -> None:
    """Measure sequence-parallel attention algorithms across many ranks."""


def _register() -> None:
    from seqpar.cli import check

    app.command("check", rich_help_panel="Verify")(check.check)
    app.add_typer(__import__("seqpar.cli.cluster").cli.cluster.app, rich_help_panel="Ray")


_register()


def main() -> None:
    """Entry point: a user error prints one line and exits 2."""
    from seqpar.cli.display import err_console

    try:
        app()
    except SeqparError as err:
        err_console.print(f"[red]error:[/red] {err}", highlight=False, soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
