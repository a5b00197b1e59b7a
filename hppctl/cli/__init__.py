"""The `hppctl` command line: one module per command, and the only error boundary.

Library code raises `HppctlError` subclasses; `main` turns them into one `error: …` line on
stderr and the exit code the contract names (1 runtime, 2 bad input, 3 infeasible).
`--debug` (anywhere on the line) shows the traceback instead.
"""

from __future__ import annotations

import sys
import traceback

import typer

try:  # typer >= 0.29 vendors its own click; its exceptions are not click's
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover - older typer uses click itself
    from click import exceptions as click_exceptions

from hppctl import __version__
from hppctl.errors import BadInput, HppctlError, one_line

app = typer.Typer(
    name="hppctl",
    help="Hybrid pipeline parallel training and collaborative inference on heterogeneous edge devices.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"hppctl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors."),
) -> None:
    """hppctl: profile -> plan -> simulate -> run, on a pool of heterogeneous devices."""


def _register() -> None:
    # Imported here so that `hppctl plan` never pays for torch: each module imports its heavy
    # dependencies inside the command function that needs them.
    from hppctl.cli import models_cmd, plan, profile, simulate

    models_cmd.register(app)
    profile.register(app)
    plan.register(app)
    simulate.register(app)
    from hppctl.cli import lab; lab.register(app)  # noqa: E702  (the edge lab, issue 4)
    from hppctl.cli import psl; psl.register(app)  # noqa: E702  (parallel split learning, issue 11)
    from hppctl.cli import run as run_cmd; run_cmd.register(app)  # noqa: E702  (training runtime, issue 6)
    from hppctl.cli import demo; demo.register(app)  # noqa: E702  (issue 6)
    from hppctl.cli import coordinator; coordinator.register(app)  # noqa: E702  (fault tolerance, issue 7)


_register()


def run(argv: list[str]) -> int:
    """Run the CLI on `argv` and return the exit code (tests call this directly)."""
    debug = "--debug" in argv
    try:
        result = app(args=argv, prog_name="hppctl", standalone_mode=False)
        return result if isinstance(result, int) else 0
    except HppctlError as e:
        if debug:
            traceback.print_exc()
        # Bad input is one bounded line whatever it quotes; a worker's failure keeps its last lines, each bounded.
        lines = [str(e)] if isinstance(e, BadInput) else str(e).splitlines() or [""]
        print("error: " + "\n".join(one_line(line) for line in lines), file=sys.stderr)
        return e.exit_code
    except typer.Exit as e:
        return e.exit_code
    except click_exceptions.NoArgsIsHelpError as e:  # bare `hppctl`: show the help
        print(e.format_message())
        return 0
    except click_exceptions.ClickException as e:  # usage errors: bad option, missing argument
        path = e.ctx.command_path if getattr(e, "ctx", None) else "hppctl"
        print(f"error: {one_line(e.format_message())} (see {path} --help)", file=sys.stderr)
        return 2
    except typer.Abort:
        print("error: aborted", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


def main() -> None:
    sys.exit(run(sys.argv[1:]))
