"""Shared output helpers: `--json` documents on stdout, tables for people, progress on stderr."""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager

from rich.console import Console

stderr = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 200)
# Piped output (files, CI logs) gets wide tables instead of rich's 80-column default.
stdout = Console(highlight=False, width=None if sys.stdout.isatty() else 200)


_documents_emitted = 0
"""JSON documents this command wrote to stdout: the error boundary adds its error document only to
an empty stdout (a partial failure, such as `profile --json` with a device lost, has printed its
summary already, and stdout must hold exactly one document)."""


def emit_json(data: object) -> None:
    """Exactly one JSON document on stdout."""
    global _documents_emitted
    sys.stdout.write(json.dumps(data, indent=2) + "\n")
    sys.stdout.flush()
    _documents_emitted += 1


def json_emitted() -> bool:
    return _documents_emitted > 0


def forget_json_emitted() -> None:
    """A new command starts (tests run several in one process)."""
    global _documents_emitted
    _documents_emitted = 0


def note(message: str) -> None:
    """Progress for people, on stderr so that `--json` stdout stays clean."""
    if _status_line is not None:  # the line would run into the message
        _status_line.close()
    stderr.print(message)


DEFAULT_LOG_EVERY_S = 30.0
"""`--log-every` when stderr is not a terminal and the flag is not given."""

LOG_EVERY_HELP = ("Progress as plain lines on stderr, each with a UTC timestamp: one every SECONDS and one at "
                  "each phase's start and end (default: 30 when stderr is not a terminal, none on a terminal, "
                  "which shows bars; 0.01 to 2592000).")


def progress_log(log_every: float | None):
    """The command's `ProgressLog` (runtime/progress.py), or None: lines every `log_every` seconds
    when given, every 30 s when stderr is not a terminal (a log, CI, cron: a rich bar there prints
    only its last state), none on a terminal, where the bars show progress. Use it as a context
    manager: its thread writes the interval lines while a phase blocks the command."""
    from hppctl.runtime.progress import ProgressLog

    every = log_every if log_every is not None else (None if stderr.is_terminal else DEFAULT_LOG_EVERY_S)
    return ProgressLog(_log_write, every) if every is not None else None


def _log_write(line: str) -> None:
    stderr.print(line, markup=False, highlight=False, soft_wrap=True)


class PhaseDisplay:
    """A phase of a command that can last (a test pass, a recalibration, Galaxy's passes, starting
    workers): a transient bar on a terminal (a spinner with the elapsed time when the phase has no
    count), and `log`'s start, interval and end lines. `update(done, status=None)`: the log's status
    is "NAME DONE/TOTAL UNIT" unless given; `close()` at the end."""

    def __init__(self, log, name: str, *, total: int | None = None, unit: str = "", quiet: bool = False) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.log, self.name, self.total, self.unit = log, name, total, unit
        self.bar = None
        if stderr.is_terminal and not quiet:
            columns = (BarColumn(), MofNCompleteColumn(), TextColumn(unit)) if total else (SpinnerColumn(),)
            self.bar = Progress(TextColumn(f"[bold]{name}[/]"), *columns, TimeElapsedColumn(), console=stderr,
                                transient=True)
            self.task = self.bar.add_task(name, total=total)
            self.bar.start()
        if log is not None:
            log.begin(name, f"{total} {unit}".strip() if total else "")

    def update(self, done: float, status: str | None = None) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=done)
        if self.log is not None:
            self.log.update(status or f"{self.name} {done:g}/{self.total} {self.unit}".rstrip())

    def close(self, failed: bool = False) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
        if self.log is not None:
            self.log.end(failed=failed)


@contextmanager
def phase(log, name: str, *, total: int | None = None, unit: str = "", quiet: bool = False):
    """`PhaseDisplay` for a `with` block; yields its `update`."""
    display = PhaseDisplay(log, name, total=total, unit=unit, quiet=quiet)
    try:
        yield display.update
    except BaseException:
        display.close(failed=True)
        raise
    display.close()


class StatusLine:
    """One line on the terminal's stderr, rewritten in place by `show(text)` and cleared by `close()`,
    with no thread: for a phase whose work cannot share its process with one (the planner forks its
    large loops only when it is the process's one thread, planner/forked.py). Every text is written:
    with no thread to write a held-back one later, a skipped text would stay unseen through a long
    step after it (a throttled first version hid a 40-second strategy's name)."""

    def __init__(self, name: str, *, clock=None) -> None:
        import time

        self.name = name
        self.clock = clock or time.monotonic
        self.started = self.clock()
        self.shown = False

    def show(self, text: str) -> None:
        line = f"{self.name} {self.clock() - self.started:.0f} s · {text}"
        width = max(20, stderr.size.width - 1)
        stderr.file.write("\r\x1b[K" + (line if len(line) <= width else line[:width - 1] + "…"))
        stderr.file.flush()
        self.shown = True
        global _status_line
        _status_line = self

    def close(self) -> None:
        global _status_line
        if self.shown:
            stderr.file.write("\r\x1b[K")
            stderr.file.flush()
            self.shown = False
        if _status_line is self:
            _status_line = None


_status_line: StatusLine | None = None
"""The `StatusLine` on screen, which `note` clears before it prints."""


@contextmanager
def planning_progress(log, *, terminal: bool | None = None):
    """Where the planner is while the block plans (planner/progress.py): a `StatusLine` on a terminal
    (`terminal`; default: whether stderr is one); in a log (`log`, a `ProgressLog`, or None), a line
    per `log.every` seconds once planning has taken that long, so a plan of a second adds nothing to a
    cron job's log. No thread either way."""
    import time

    from hppctl.planner import progress

    line = StatusLine("planning") if (stderr.is_terminal if terminal is None else terminal) else None
    started = time.monotonic()
    due = started + (log.every if log is not None else float("inf"))

    def show(text: str) -> None:
        nonlocal due
        if line is not None:
            line.show(text)
        now = time.monotonic()
        if now >= due:
            log.event(f"planning for {now - started:.0f} s: {text}")
            due = now + log.every

    try:
        with progress.reporting(show):
            yield
    finally:
        if line is not None:
            line.close()


def writable_path(flag: str, path, *, directory: bool = False) -> None:
    """Fail now (exit 2, naming the flag) on an output path the command could not write at the end.

    Every command calls it on each output flag right after parsing its flags, before it loads a
    file or starts a worker: a run that trains for an hour and then cannot save what it learned, or
    that emptied a symlink's target through `--metrics`, is the failure this prevents. A file must
    be missing or a regular file (`store.check_output_path`: never a symlink, FIFO or device). Its
    folder is created here, as writing would create it anyway. `directory`: the path itself is a
    folder (checkpoints)."""
    import os
    from pathlib import Path

    from hppctl.errors import BadInput
    from hppctl.store import check_output_path

    if path is None:
        return
    path = Path(path)
    folder = path if directory else path.parent
    if directory:
        if path.exists() and not path.is_dir():
            raise BadInput(f"{flag}: {path} is a file, not a directory")
    elif os.path.isdir(path):  # not Path.is_dir: it raises on a name too long
        raise BadInput(f"{flag}: {path} is a directory")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BadInput(f"{flag}: {path}: cannot create the folder {folder} ({e.strerror or e})") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise BadInput(f"{flag}: {path}: the folder {folder} is not writable")
    if not directory:  # in a folder that exists now: what is at the path itself
        try:
            check_output_path(path)
        except BadInput as e:
            raise BadInput(f"{flag}: {e}") from None
