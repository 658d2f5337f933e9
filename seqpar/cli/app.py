"""The `seqpar` command. Heavy imports (torch, ray, mlflow) live inside commands: --help is instant."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from seqpar.errors import SeqparError

app = typer.Typer(
    name="seqpar", no_args_is_help=True, add_completion=False,
    help="Measure sequence-parallel attention algorithms across many ranks.",
)


@app.callback()
def _root(
    address: Annotated[str | None, typer.Option(
        "--address",
        help="Ray cluster to join ('auto', 'ray://host:10001', 'host:6379'); default: an embedded "
             "local Ray.")] = None,
    tracking_uri: Annotated[str | None, typer.Option(
        "--tracking-uri", envvar="MLFLOW_TRACKING_URI",
        help="MLflow store or server; default: sqlite:///<working dir>/mlflow.db with artifacts "
             "in ./mlartifacts.")] = None,
) -> None:
    """Measure sequence-parallel attention algorithms across many ranks."""
    from seqpar.cli.options import GLOBALS

    GLOBALS.address, GLOBALS.tracking_uri = address, tracking_uri


def _register() -> None:
    from seqpar.cli import check

    app.command("check", rich_help_panel="Verify")(check.check)
    app.add_typer(__import__("seqpar.cli.cluster").cli.cluster.app, rich_help_panel="Ray")
    from seqpar.cli import compare, report, studies, sweep, tune

    app.command("studies", rich_help_panel="Experiments")(studies.studies)
    app.command("run", rich_help_panel="Experiments")(sweep.run)
    app.command("sweep", rich_help_panel="Experiments")(sweep.sweep)
    app.command("tune", rich_help_panel="Experiments")(tune.tune)
    app.command("compare", rich_help_panel="Results")(compare.compare)
    app.command("plan", rich_help_panel="Experiments")(__import__("seqpar.cli.plan").cli.plan.plan)
    app.command("calibrate", rich_help_panel="Experiments")(
        __import__("seqpar.cli.calibrate").cli.calibrate.calibrate)
    app.command("report", rich_help_panel="Results")(report.report)


_register()


def main() -> None:
    """Entry point: a user error (ours or a usage error: unknown option, -1 where a count goes, a
    missing argument) prints one line and exits 2; otherwise the command's exit code."""
    try:  # typer >= 0.22 vendors click
        from typer._click import exceptions as click_errors
    except ImportError:
        from click import exceptions as click_errors

    from seqpar.cli.display import err_console

    def fail(message: str) -> None:
        from rich.markup import escape  # a value like [1, 2] is data, not a style tag

        line = " ".join(message.split())
        err_console.print(f"[red]error:[/red] {escape(line)}", highlight=False, soft_wrap=True)
        sys.exit(2)

    try:
        code = app(standalone_mode=False)
    except SeqparError as err:
        fail(str(err))
    except click_errors.NoArgsIsHelpError as err:  # `seqpar` or `seqpar cluster` alone
        err.show()
        sys.exit(err.exit_code)
    except click_errors.UsageError as err:
        command = err.ctx.command_path if err.ctx is not None else "seqpar"
        fail(f"{err.format_message()} (see `{command} --help`)")
    except typer.Abort:  # Ctrl-C or end of input outside a command that handles it
        sys.exit(130)
    except click_errors.ClickException as err:
        fail(err.format_message())
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
