"""The CLI's plain coercion (`seqpar.cli.coerce`) gives what typer's own gives, value or error, for
every plain parameter of `seqpar plan` and the root; and a plan runs without building typer's."""

from __future__ import annotations

import subprocess
import sys

import typer.main as typer_main
from typer._click.exceptions import BadParameter
from typer._coercion import build_runtime_param

from seqpar.cli import coerce
from seqpar.cli.app import app
from seqpar.cli.options import Settings

VALUES = {
    int: ["0", "12", "-3", "007", "-0", "+5", " 4", "1_000", "5.0", "1e3", "x", "", "1" * 25, 7,
          True],
    float: ["0", "1.5", "-2.25", "2", "007.50", "+1.5", " 1.5", "1e3", "inf", "nan", ".5", "5.",
            "x", "", 1, 2.5, True],
    str: ["a", "", " b ", "7", 7, None],
    bool: [True, False, "true", "no", 1],
    list[str]: [(), ("a", "b"), ["c"], ("a", 1), "a"],
}


def _outcome(runtime, value, param, ctx):
    try:
        return "value", repr(runtime.coerce(value, param=param, ctx=ctx))  # nan is nan
    except BadParameter as err:
        return "error", err.format_message()


def _command_and_ctx(name):
    group = typer_main.get_group(app)
    root = group.make_context("seqpar", [name, "--help"], resilient_parsing=True,
                              obj=Settings())
    command = group.get_command(root, name)
    return group, root, command


def test_plain_coercion_is_typers_for_every_plain_parameter():
    group, root, command = _command_and_ctx("plan")
    ctx = command.context_class(command, parent=root, **command.context_settings)
    plain = 0
    for cmd, c in ((group, root), (command, ctx)):
        for param in cmd.get_params(c):
            if not isinstance(param._runtime_param, coerce.PlainParam):
                assert param._runtime_param is None  # typer's, built on first use as before
                continue
            plain += 1
            theirs = build_runtime_param(param.type_descriptor)
            for value in VALUES[param.type_descriptor.annotation]:
                assert (_outcome(param._runtime_param, value, param, c)
                        == _outcome(theirs, value, param, c)), (param.name, value)
    assert plain >= 30  # the plan's flags (str, int, float, bool, repeated str) and the help options


def test_a_plan_builds_no_typer_adapter():
    code = ("import sys; sys.argv = ['seqpar', 'plan', '--world', '4', '--top', '1']; "
            "from seqpar.cli.app import main\n"
            "code = 0\ntry:\n    main()\nexcept SystemExit as stop:\n    code = stop.code or 0\n"
            "print(code, 'typer._adapters' in sys.modules, file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stderr.strip().splitlines()[-1] == "0 False"  # the plan ran, and built none
