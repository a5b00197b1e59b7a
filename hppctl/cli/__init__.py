"""The `hppctl` command line: one module per command, and the only error boundary.

Library code raises `HppctlError` subclasses; `main` turns them into one `error: …` line on
stderr and the exit code the contract names (`hppctl.errors.EXIT_CODES`: 1 runtime, 2 bad input,
3 infeasible, 4 diverged, 75 lock held by another run, 141 broken pipe); with `--json`, also a JSON
error document on stdout.
`--debug` (anywhere on the line) shows the traceback instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback

import typer

try:  # typer >= 0.29 vendors its own click; its exceptions are not click's
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover - older typer uses click itself
    from click import exceptions as click_exceptions

from hppctl import __version__
from hppctl.cli import output
from hppctl.errors import BadInput, HppctlError, one_line
from hppctl.shutdown import exit_process

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
    from hppctl.cli import check, coordinator, demo, lab, models_cmd, plan, profile, psl, run_cmd, simulate

    for command in (models_cmd, profile, plan, simulate, lab, psl, run_cmd, demo, coordinator, check):  # help's order
        command.register(app)


_register()


def run(argv: list[str]) -> int:
    """Run the CLI on `argv` and return the exit code (tests call this directly)."""
    debug = "--debug" in argv
    as_json = "--json" in argv[: argv.index("--")] if "--" in argv else "--json" in argv
    output.forget_json_emitted()
    try:
        result = app(args=argv, prog_name="hppctl", standalone_mode=False)
        sys.stdout.flush()  # inside the boundary: a reader gone away is met here, not at interpreter exit
        return result if isinstance(result, int) else 0
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except SystemExit as e:  # rich meets a broken pipe with SystemExit(1) (Console.on_broken_pipe)
        if isinstance(e.__context__, BrokenPipeError):
            return _quiet_broken_pipe()
        raise
    except HppctlError as e:
        if debug:
            traceback.print_exc()
        # Bad input is one bounded line whatever it quotes; a worker's failure keeps its last lines, each bounded.
        lines = [str(e)] if isinstance(e, BadInput) else str(e).splitlines() or [""]
        return _report(e.exit_code, e.kind, "\n".join(one_line(line) for line in lines), as_json)
    except typer.Exit as e:
        return e.exit_code
    except click_exceptions.NoArgsIsHelpError as e:  # bare `hppctl`: show the help
        print(e.format_message())
        return 0
    except click_exceptions.ClickException as e:  # usage errors: bad option, missing argument
        path = e.ctx.command_path if getattr(e, "ctx", None) else "hppctl"
        return _report(BadInput.exit_code, BadInput.kind, f"{one_line(e.format_message())} (see {path} --help)", as_json)
    except typer.Abort:
        return _report(130, "interrupted", "aborted", as_json)
    except KeyboardInterrupt:
        return _report(130, "interrupted", "interrupted", as_json)


def _report(code: int, kind: str, message: str, as_json: bool) -> int:
    """The one way an error leaves the CLI: `error: …` on stderr and, with `--json`, the JSON error
    document `{"error": {"code", "kind", "message"}}` on stdout (so that stdout is never empty), unless
    the command printed its own document before failing (stdout holds exactly one)."""
    print(f"error: {message}", file=sys.stderr)
    if as_json and not output.json_emitted():
        try:
            print(json.dumps({"error": {"code": code, "kind": kind, "message": message}}))
            sys.stdout.flush()
        except BrokenPipeError:
            _silence_stdout()
    return code


BROKEN_PIPE_EXIT = 141
"""128 + SIGPIPE: what `seq 1000000 | head -1` reports for `seq` (errors.EXIT_CODES)."""


def _quiet_broken_pipe() -> int:
    """stdout's reader went away (`hppctl models | head -1`): no traceback, no error line, exit 141."""
    _silence_stdout()
    return BROKEN_PIPE_EXIT


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush cannot fail (it printed
    `Exception ignored … BrokenPipeError` or exited 1 with nothing said)."""
    with contextlib.suppress(OSError, ValueError):  # stdout without a descriptor (a test's capture): nothing to flush
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def main() -> None:
    from hppctl.runtime.zygote import this_process_is_a_launcher

    this_process_is_a_launcher()  # its local workers' fork server may be a fork of it (runtime/zygote.py)
    exit_process(run(sys.argv[1:]))  # without the collector's shutdown passes: hppctl/shutdown.py
