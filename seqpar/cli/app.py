"""The `seqpar` command. The command modules are light (typer, rich, the CLI's own helpers); what a
command runs (torch, Ray, MLflow behind seqpar's floors) is imported inside it, so `--help` is
instant and `seqpar plan` never loads torch."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.markup import escape

from seqpar.cli import calibrate, check, cluster, compare, plan, report, studies, sweep, tune
from seqpar.cli.display import err_console
from seqpar.cli.options import Settings
from seqpar.errors import SeqparError

try:  # typer >= 0.22 vendors click
    from typer._click import exceptions as click_errors
except ImportError:
    from click import exceptions as click_errors

app = typer.Typer(
    name="seqpar", no_args_is_help=True, add_completion=False,
    help="Measure sequence-parallel attention algorithms across many ranks.",
)


@app.callback()
def _root(
    ctx: typer.Context,
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
    ctx.obj = Settings(address, tracking_uri)  # every command finds them in its context


app.command("check", rich_help_panel="Verify")(check.check)
app.add_typer(cluster.app, rich_help_panel="Ray")
app.command("studies", rich_help_panel="Experiments")(studies.studies)
app.command("run", rich_help_panel="Experiments")(sweep.run)
app.command("sweep", rich_help_panel="Experiments")(sweep.sweep)
app.command("tune", rich_help_panel="Experiments")(tune.tune)
app.command("compare", rich_help_panel="Results")(compare.compare)
app.command("plan", rich_help_panel="Experiments")(plan.plan)
app.command("calibrate", rich_help_panel="Experiments")(calibrate.calibrate)
app.command("report", rich_help_panel="Results")(report.report)


def main() -> None:
    """Entry point: a user error (ours or a usage error: unknown option, -1 where a count goes, a
    missing argument) prints one line and exits 2; otherwise the command's exit code."""
    def fail(message: str) -> None:
        line = " ".join(message.split())
        # escape: a value like [1, 2] is data, not a style tag
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
