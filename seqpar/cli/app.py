"""The `seqpar` command. Each command's module is imported when that command is named (`COMMANDS`),
so `seqpar plan` loads the planner and nothing else (no torch, Ray or MLflow) and `--help` loads
the CLI's modules only; what a command runs behind them (torch, Ray, MLflow) loads inside it."""

from __future__ import annotations

import difflib
import importlib
import sys
from typing import Annotated

import typer
from rich.markup import escape
from typer.core import TyperGroup
from typer.main import get_command_from_info, get_group
from typer.models import CommandInfo

from seqpar.cli import coerce
from seqpar.cli.display import err_console
from seqpar.cli.options import Settings
from seqpar.errors import SeqparError

try:  # typer >= 0.22 vendors click
    from typer import _click as click
except ImportError:
    import click  # type: ignore[no-redef]
click_errors = click.exceptions

# name -> (module in seqpar.cli, its function, or its Typer app when None, the help panel)
COMMANDS: dict[str, tuple[str, str | None, str]] = {
    "check": ("check", "check", "Verify"),
    "cluster": ("cluster", None, "Ray"),
    "studies": ("studies", "studies", "Experiments"),
    "run": ("sweep", "run", "Experiments"),
    "sweep": ("sweep", "sweep", "Experiments"),
    "tune": ("tune", "tune", "Experiments"),
    "compare": ("compare", "compare", "Results"),
    "plan": ("plan", "plan", "Experiments"),
    "lengths": ("lengths", "lengths", "Experiments"),
    "calibrate": ("calibrate", "calibrate", "Experiments"),
    "report": ("report", "report", "Results"),
}


class LazyCommands(TyperGroup):
    """The root group: it lists `COMMANDS` and builds each one's click command the first time it
    is named (importing its module then)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple:
        try:
            return super().resolve_command(ctx, args)
        except click_errors.UsageError as err:  # typer suggests from the commands built so far
            near = difflib.get_close_matches(args[0], list(COMMANDS)) if args else []
            if near and "Did you mean" not in err.message:
                err.message = (f"{err.message.rstrip('.')}. Did you mean "
                               f"{', '.join(repr(n) for n in near)}?")
            raise

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        coerce.install(self, ctx)  # the root's own options (--address, --tracking-uri)
        return super().parse_args(ctx, args)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, function, panel = COMMANDS[cmd_name]
            mod = importlib.import_module(f"seqpar.cli.{module}")
            if function is None:
                command = get_group(mod.app)
            else:
                command = get_command_from_info(
                    CommandInfo(name=cmd_name, callback=getattr(mod, function),
                                rich_help_panel=panel),
                    pretty_exceptions_short=app.pretty_exceptions_short,
                    rich_markup_mode=self.rich_markup_mode)
            command.rich_help_panel = panel  # type: ignore[attr-defined]
            coerce.install(command, ctx)
            self.commands[cmd_name] = command
        return self.commands.get(cmd_name)


app = typer.Typer(
    name="seqpar", cls=LazyCommands, no_args_is_help=True, add_completion=False,
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
