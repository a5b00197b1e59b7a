"""Run hppctl on hostile input, in-process (fast) or in a subprocess (real tracebacks, hangs), and
check the bad-input contract on what came out.

The contract (README "Exit codes", docs/formats.md): exit 0, 1, 2 or 3; for bad input exit 2 (3
infeasible) with one `error: FILE: FIELD: message` line; never a traceback; at most 3 lines on
stderr; nothing left at an output path after a failure; no hang. The hang bound is a generous
wall-clock limit that only a stuck command reaches; it is not a speed assertion.
"""

from __future__ import annotations

import contextlib
import io
import os
import resource
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCUMENTED_EXITS = {0, 1, 2, 3}
BAD_INPUT_EXITS = {0, 2, 3}
"""A mutated input: refused (2, or 3 if it is valid but infeasible), or accepted (0) if still valid."""
MAX_STDERR_LINES = 4
"""A refusal is one line; an accepted run may add the optimizer chosen for it (runtime/optimizer_defaults.py)
and its progress lines."""
MAX_STDERR_CHARS = 4096
"""An error line names the value, capped: never a 200 kB value echoed back (issue 23, item 8)."""
HANG_BOUND_S = 60
IN_PROCESS_HANG_BOUND_S = 20
MEMORY_BOUND_BYTES = 8 * 2**30
"""Address-space limit of a fuzzed subprocess (and of the in-process session): a mutation such as
`count: 10**30` must fail on it, not take the shared machine's memory."""


@dataclass
class Outcome:
    argv: list[str]
    code: int | None
    stdout: str
    stderr: str
    hung: bool = False

    def describe(self) -> str:
        lines = self.stderr.strip().splitlines()
        return (f"hppctl {' '.join(self.argv)}\n  exit {self.code}{' (hung)' if self.hung else ''}\n"
                f"  first stderr line: {lines[0][:300] if lines else ''!r}\n"
                f"  last stderr line: {lines[-1][:300] if lines else ''!r}")


class _Hang(BaseException):
    """Raised by the alarm in an in-process call that ran past the bound (BaseException: the CLI's
    handlers must not turn it into an exit code)."""


def _on_alarm(signum, frame):
    raise _Hang()


def invoke(argv: list[str], bound_s: int = IN_PROCESS_HANG_BOUND_S) -> Outcome:
    """`hppctl ARGV` through `hppctl.cli.run` with stdout/stderr captured. An exception that escapes
    the CLI's error boundary is what a user would see as a traceback: it is put on stderr as one."""
    from hppctl.cli import run

    argv = [str(a) for a in argv]
    out, err = io.StringIO(), io.StringIO()
    hung, code = False, None
    with _alarm_after(bound_s):
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = run(argv)
            except _Hang:
                hung = True
            except BaseException:  # noqa: BLE001 - whatever escapes is the finding
                err.write(traceback.format_exc())
                code = 1
    return Outcome(argv, code, out.getvalue(), err.getvalue(), hung)


@contextlib.contextmanager
def _alarm_after(seconds: float):
    """Raise `_Hang` in this thread after `seconds`; then put back whatever alarm was set before
    (pytest-timeout's signal method uses the same timer), less the time spent here."""
    previous_handler = signal.signal(signal.SIGALRM, _on_alarm)
    previous_delay, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    started = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_handler)
        if previous_delay:
            signal.setitimer(signal.ITIMER_REAL, max(previous_delay - (time.monotonic() - started), 0.001))


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BOUND_BYTES, MEMORY_BOUND_BYTES))


def invoke_subprocess(argv: list[str], bound_s: int = HANG_BOUND_S, gated: bool = True, cwd: Path | None = None) -> Outcome:
    """`hppctl ARGV` as a real process (this tree first on PYTHONPATH). `gated`: through
    tests/fuzz/dry_cli.py, which stops before workers, measurements and labs (gates.py)."""
    argv = [str(a) for a in argv]
    entry = ["-m", "tests.fuzz.dry_cli"] if gated else ["-m", "hppctl"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    try:
        done = subprocess.run([sys.executable, *entry, *argv], capture_output=True, text=True, errors="replace",
                              timeout=bound_s, env=env, cwd=cwd or REPO, stdin=subprocess.DEVNULL,
                              preexec_fn=_limit_memory)
    except subprocess.TimeoutExpired as e:
        return Outcome(argv, None, _text(e.stdout), _text(e.stderr), hung=True)
    return Outcome(argv, done.returncode, done.stdout, done.stderr)


def _text(data) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def contract_violations(outcome: Outcome, outputs: tuple[Path, ...] = (), allowed: set[int] = BAD_INPUT_EXITS) -> list[str]:
    """Every way `outcome` breaks the bad-input contract (empty: it keeps it)."""
    problems = []
    if outcome.hung:
        problems.append("did not finish within the hang bound")
    if outcome.code not in DOCUMENTED_EXITS:
        problems.append(f"exit {outcome.code} is not a documented exit code")
    elif outcome.code not in allowed:
        problems.append(f"exit {outcome.code}, expected one of {sorted(allowed)}")
    if "Traceback" in outcome.stderr:
        problems.append("a traceback on stderr")
    lines = outcome.stderr.strip().splitlines()
    if len(lines) > MAX_STDERR_LINES:
        problems.append(f"{len(lines)} lines on stderr (at most {MAX_STDERR_LINES})")
    if len(outcome.stderr) > MAX_STDERR_CHARS:
        problems.append(f"{len(outcome.stderr)} characters on stderr (at most {MAX_STDERR_CHARS})")
    if outcome.code not in (0, None) or outcome.hung:
        left = [str(p) for p in outputs if os.path.lexists(p)]
        if left:
            problems.append(f"exit {outcome.code} left {', '.join(left)} behind")
    if outcome.code == 2 and not any(line.startswith("error: ") for line in lines):
        problems.append("exit 2 without an `error: ` line")
    return problems


def assert_contract(outcome: Outcome, outputs: tuple[Path, ...] = (), allowed: set[int] = BAD_INPUT_EXITS) -> None:
    problems = contract_violations(outcome, outputs, allowed)
    assert not problems, "; ".join(problems) + "\n" + outcome.describe()
